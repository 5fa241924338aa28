package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// Tables, raw results and plots of the eviction benchmark.

// summarize computes the overhead of each policy at each rate (see
// evict_overhead.go); a rate whose victims did not all run is left out.
func (r *EvictOverheadRun) summarize() {
	base := sum(r.Plain.LatencyMS)
	if base == 0 || len(r.Plain.LatencyMS) != r.Calls {
		return
	}
	var kappaChecks float64 // what the Kappa-style function's saves cost the workload
	if len(r.Kappa.LatencyMS) == r.Calls {
		kappaChecks = sum(r.Kappa.LatencyMS) - base
		r.KappaNoEviction = kappaChecks / base
	}
	for policy, hits := range r.Hits {
		fixed := 0.0
		if policy == PolicyKappa {
			if len(r.Kappa.LatencyMS) != r.Calls {
				continue
			}
			fixed = kappaChecks
		}
		var over []float64
		for _, rate := range r.Rates {
			n := victimsAt(rate, r.Calls)
			if n > len(hits) {
				break
			}
			extra := fixed
			for _, h := range hits[:n] {
				extra += h.cost()
			}
			over = append(over, extra/base)
		}
		r.Overhead[policy] = over
	}
}

// cost is what the eviction cost the call, in ms.
func (h OverheadHit) cost() float64 { return h.LatencyMS - h.ControlMS }

// victimsAt is how many calls of calls an eviction rate (percent) hits.
func victimsAt(rate float64, calls int) int { return int(math.Round(rate * float64(calls) / 100)) }

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return sum(v) / float64(len(v))
}

func printEvictConcurrency(w io.Writer, r *EvictConcurrencyRun) {
	fmt.Fprintf(w, "\nconcurrent checkpoints (R-Check §5.7): %d MB of random bytes per call, calls of ~%g s, uninterrupted call %.0f ms\n",
		r.MB, r.CallSeconds, r.BaselineMS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tmoved\tfailed\tcheckpoint p50 ms\tp95\trestore p50 ms\tp95\timage MB p50\tcall p50 ms\tvs uninterrupted\teviction ms\t")
	for _, s := range r.Steps {
		var img []float64
		for i, b := range s.ImageBytes {
			if s.CheckpointMS[i] > 0 {
				img = append(img, float64(b)/(1<<20))
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%s\t%.0f\t\n", s.N, s.Moved, s.Failures, s.CheckpointP50, s.CheckpointP95,
			s.RestoreP50, s.RestoreP95, floatPercentile(img, 50), s.LatencyP50, ratioSig(s.LatencyP50/r.BaselineMS), s.EvictionMS)
	}
	tw.Flush()
	var errs []string
	fails := 0
	for _, s := range r.Steps {
		errs = append(errs, s.Errors...)
		fails += s.Failures
	}
	printFailures(w, []errorGroup{{"concurrency", fails, errs}})
}

func printEvictOnce(w io.Writer, r *EvictOnceRun) {
	verdict := "every call returned the result, and left the counts, of exactly one uninterrupted run"
	if r.Mismatches+r.Failures > 0 {
		verdict = fmt.Sprintf("%d MISMATCHES, %d FAILED CALLS", r.Mismatches, r.Failures)
	}
	fmt.Fprintf(w, "\nexactly once: %d trials (batches of %d, SIGTERM at a random instant), %d moved mid-call, %d ran on the evicted worker, %d attempts lost; uninterrupted call %.0f ms; %.0f s\n%s\n",
		len(r.Calls), r.Batch, r.Moved, r.OnEvicted, r.Lost, r.CallMS, r.ElapsedS, verdict)
}

func printEvictOverhead(w io.Writer, r *EvictOverheadRun) {
	fmt.Fprintf(w, "\noverhead vs eviction rate (R-Check Fig 5.7 shape): %d calls, Table 5.3 durations x %g, grace %d ms, Kappa period %.2f s\n",
		r.Calls, r.TimeScale, r.GraceMS, r.KappaPeriodS)
	fmt.Fprintf(w, "uninterrupted: plain %.1f s in all, Kappa-style %.1f s (%s: the cost of its checkpoints without any eviction)\n",
		r.Plain.TotalS, r.Kappa.TotalS, pct(r.KappaNoEviction))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "eviction rate\thit calls\ttorpor (R-Check)\tre-run\tKappa-style\tre-run / torpor\tKappa / torpor\t")
	for j, rate := range r.Rates {
		cell := func(p string) (string, float64) {
			if o := r.Overhead[p]; j < len(o) {
				return pct(o[j]), o[j]
			}
			return "-", math.NaN()
		}
		rc, rcv := cell(PolicyRCheck)
		rr, rrv := cell(PolicyRerun)
		kp, kpv := cell(PolicyKappa)
		fmt.Fprintf(tw, "%g%%\t%d\t%s\t%s\t%s\t%s\t%s\t\n", rate, victimsAt(rate, r.Calls), rc, rr, kp, overRatio(rrv, rcv), overRatio(kpv, rcv))
	}
	tw.Flush()
	fmt.Fprintln(w, "per hit call (all victims):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tvictims\tmoved\tre-run\tnot struck\tfailed\teviction cost s, mean\tcheckpoint p50 ms\trestore p50 ms\t")
	for _, p := range overheadPolicies {
		hits := r.Hits[p]
		var extra, ck, rs []float64
		moved, lost, missed, failed := 0, 0, 0, 0
		for _, h := range hits {
			if h.Error == "" {
				extra = append(extra, h.cost()/1000)
			}
			switch {
			case h.Error != "":
				failed++
			case h.Moved:
				moved++
				ck, rs = append(ck, h.CheckpointMS), append(rs, h.RestoreMS)
			case h.Lost:
				lost++
			default:
				missed++
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.0f\t%.0f\t\n", p, len(hits), moved, lost, missed, failed, mean(extra),
			floatPercentile(ck, 50), floatPercentile(rs, 50))
	}
	tw.Flush()
	printFailures(w, []errorGroup{{"overhead", r.Failures, r.Errors}})
}

// overRatio formats how many times overhead a is overhead b.
func overRatio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return "-"
	}
	return ratioSig(a / b)
}

// writeEvictResults writes results.json (the report), results.csv (one
// row per measured call) and a plot per part that ran.
func writeEvictResults(dir string, rep *EvictReport) error {
	plots := map[string]func(io.Writer) error{}
	title := "torpor bench evict (" + rep.Store + "); " + machineLine(rep.Machine)
	if r := rep.Concurrency; r != nil && len(r.Steps) > 0 {
		var n, ck, ck95, rs, rs95 []float64
		for _, s := range r.Steps {
			n = append(n, float64(s.N))
			ck, ck95 = append(ck, s.CheckpointP50), append(ck95, s.CheckpointP95)
			rs, rs95 = append(rs, s.RestoreP50), append(rs95, s.RestoreP95)
		}
		c := chart{Title: title, X: chartAxis{Label: "calls checkpointed at once on the evicted worker", Log: true, Ticks: n},
			Y: chartAxis{Label: fmt.Sprintf("ms per call (%d MB of random bytes)", r.MB)}, Series: []chartSeries{
				{Label: "checkpoint p50 (notice to image stored)", X: n, Y: ck, Color: Palette[0], Line: true, Dot: 5},
				{Label: "checkpoint p95", X: n, Y: ck95, Color: Palette[0], Line: true, Dash: DashDashed},
				{Label: "restore p50", X: n, Y: rs, Color: Palette[1], Line: true, Dot: 5},
				{Label: "restore p95", X: n, Y: rs95, Color: Palette[1], Line: true, Dash: DashDashed},
			}}
		plots["concurrency.png"] = func(w io.Writer) error { return renderChart(w, c) }
	}
	if r := rep.Overhead; r != nil && len(r.Overhead) > 0 {
		c := chart{Title: title, X: chartAxis{Label: "eviction rate (% of calls hit)", Ticks: r.Rates},
			Y: chartAxis{Label: fmt.Sprintf("overhead on total call time, %% (%d calls, durations x %g)", r.Calls, r.TimeScale)}}
		for k, p := range overheadPolicies {
			o := r.Overhead[p]
			var x, y []float64
			for j := range o {
				x, y = append(x, r.Rates[j]), append(y, 100*o[j])
			}
			c.Series = append(c.Series, chartSeries{Label: policyLabel(p), X: x, Y: y, Color: Palette[k], Line: true, Dot: 5})
		}
		plots["overhead.png"] = func(w io.Writer) error { return renderChart(w, c) }
	}
	if r := rep.Once; r != nil && len(r.Calls) > 0 {
		var mx, my, sx, sy []float64
		for _, cl := range r.Calls {
			if cl.Error != "" {
				continue
			}
			x := cl.EvictMS - cl.OffsetMS // the SIGTERM, after the call was sent
			if cl.Moved {
				mx, my = append(mx, x), append(my, cl.LatencyMS)
			} else {
				sx, sy = append(sx, x), append(sy, cl.LatencyMS)
			}
		}
		c := chart{Title: title, X: chartAxis{Label: "SIGTERM to the worker, ms after the call was sent (negative: before)"},
			Y: chartAxis{Label: "call latency, ms"}, Series: []chartSeries{
				{Label: "moved mid-call", X: mx, Y: my, Color: Palette[0], Dot: 3},
				{Label: "not moved (ended first, started after, or on the other worker)", X: sx, Y: sy, Color: Palette[1], Dot: 3},
			}}
		plots["exactly-once.png"] = func(w io.Writer) error { return renderChart(w, c) }
	}
	return writeResults(dir, rep, func(w *bufio.Writer) error {
		w.WriteString("part,policy,n,call,latency_ms,control_ms,evict_ms,moved,lost,checkpoint_ms,restore_ms,image_bytes,error\n")
		row := func(part, policy string, n int, call string, lat, control, evict float64, moved, lost bool, ck, rs float64, img int64, e string) {
			fmt.Fprintf(w, "%s,%s,%d,%s,%.3f,%.3f,%.3f,%t,%t,%.3f,%.3f,%d,%q\n", part, policy, n, call, lat, control, evict, moved, lost, ck, rs, img, e)
		}
		if r := rep.Concurrency; r != nil {
			for _, s := range r.Steps {
				for i := range s.CallIDs {
					row(EvictPartConcurrency, "", s.N, s.CallIDs[i], s.LatencyMS[i], 0, 0, s.CheckpointMS[i] > 0, false, s.CheckpointMS[i], s.RestoreMS[i], s.ImageBytes[i], "")
				}
			}
		}
		if r := rep.Once; r != nil {
			for _, cl := range r.Calls {
				row(EvictPartOnce, "", cl.Batch, cl.CallID, cl.LatencyMS, 0, cl.EvictMS-cl.OffsetMS, cl.Moved, false, 0, 0, 0, cl.Error)
			}
		}
		if r := rep.Overhead; r != nil {
			for i, l := range r.Plain.LatencyMS {
				row(EvictPartOverhead, "plain", 0, fmt.Sprint(i), l, 0, 0, false, false, 0, 0, 0, "")
			}
			for i, l := range r.Kappa.LatencyMS {
				row(EvictPartOverhead, "kappa-plain", 0, fmt.Sprint(i), l, 0, 0, false, false, 0, 0, 0, "")
			}
			for _, p := range overheadPolicies {
				for k, h := range r.Hits[p] {
					row(EvictPartOverhead, p, k, fmt.Sprint(h.I), h.LatencyMS, h.ControlMS, h.EvictMS, h.Moved, h.Lost, h.CheckpointMS, h.RestoreMS, h.ImageBytes, h.Error)
				}
			}
		}
		return nil
	}, plots)
}

func policyLabel(p string) string {
	switch p {
	case PolicyRCheck:
		return "torpor (R-Check): moved on the notice"
	case PolicyRerun:
		return "re-run from the start"
	default:
		return "Kappa-style: saves every 25 s"
	}
}
