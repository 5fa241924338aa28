package bench

import (
	"bufio"
	"fmt"
	"image/color"
	"io"
	"text/tabwriter"
)

// PrintBurstsTables prints every burst, then each phase's bursts and
// background against the baseline's, then the failures.
func PrintBurstsTables(w io.Writer, rep *BurstsReport) {
	fmt.Fprintf(w, "bursts of %d parallel calls (torpor: to a NOP function deployed just before, nothing of it cached):\n", rep.BurstSize)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\t#\tat s\tprep ms\tn\tfailed\tp50 ms\tp99 ms\tmax ms\tdone ms\t  start paths\n", "phase")
	for _, ph := range rep.Phases {
		for _, br := range ph.Bursts {
			fmt.Fprintf(tw, "%-28s\t%d\t%.1f\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t  %s\n", ph.Name, br.Index, br.FireS, msF(br.PrepMS), br.N, br.Failures,
				msN(br.N, br.P50US), msN(br.N, br.P99US), msN(br.N, br.MaxUS), msPos(br.CompletionMS), startMix(br.Starts))
		}
	}
	tw.Flush()

	fmt.Fprintln(w, "\nper phase, every call of every burst (done: release to last answer):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\tbursts\tn\tfailed\tp50 ms\tp99 ms\tmax ms\tdone p50 ms\tdone max ms\tp50/base\tp99/base\tdone/base\t\n", "phase")
	for _, ph := range rep.Phases {
		a := ph.AllBursts
		fmt.Fprintf(tw, "%-28s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", ph.Name, len(ph.Bursts), a.N, a.Failures,
			msN(a.N, a.P50US), msN(a.N, a.P99US), msN(a.N, a.MaxUS), msPos(ph.CompletionP50MS), msPos(ph.CompletionMaxMS),
			ratioSig(ph.RatioBurstP50), ratioSig(ph.RatioBurstP99), ratioSig(ph.RatioCompletion))
	}
	tw.Flush()

	fmt.Fprintf(w, "\nbackground: a function sleeping 50 ms, %g calls/s open loop (quiet: overlapping no burst):\n", rep.Rate)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\tn\tfailed\tp50 ms\tp99 ms\tmax ms\tquiet p50\tquiet p99\tin-burst n\tin-burst p50\tin-burst p99\tp99/base\t  start paths\n", "phase")
	for _, ph := range rep.Phases {
		g := ph.Background
		fmt.Fprintf(tw, "%-28s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t  %s\n", ph.Name, g.N, g.Failures, msN(g.N, g.P50US), msN(g.N, g.P99US), msN(g.N, g.MaxUS),
			msN(g.Quiet.N, g.Quiet.P50US), msN(g.Quiet.N, g.Quiet.P99US), g.InBurst.N, msN(g.InBurst.N, g.InBurst.P50US), msN(g.InBurst.N, g.InBurst.P99US), ratioSig(ph.RatioBackgroundP99), startMix(g.Starts))
	}
	tw.Flush()

	var groups []errorGroup
	for _, ph := range rep.Phases {
		groups = append(groups, errorGroup{ph.Name + " background", ph.Background.Failures, ph.Background.Errors})
		for _, br := range ph.Bursts {
			groups = append(groups, errorGroup{fmt.Sprintf("%s burst %d", ph.Name, br.Index), br.Failures, br.Errors})
		}
	}
	printFailures(w, groups)
}

// WriteBurstsResults writes results.json (the report), results.csv (one
// row per call) and timeline.png (latency over time, bursts marked) to dir.
func WriteBurstsResults(dir string, rep *BurstsReport) error {
	type key struct{ system, kind string }
	series := map[key]*chartSeries{}
	order := []key{{"torpor", "background"}, {"torpor", "burst"}, {SeriesFork, "background"}, {SeriesFork, "burst"}}
	colors := []color.RGBA{Palette[0], Palette[1], Palette[9], Palette[3]}
	for i, k := range order {
		series[k] = &chartSeries{Label: k.system + " " + k.kind + " calls", Color: colors[i], Dot: 3}
	}
	add := func(k key, calls []TimedCall) {
		s := series[k]
		for _, c := range calls {
			if c.OK {
				s.X, s.Y = append(s.X, c.SendS), append(s.Y, float64(c.LatencyUS)/1000)
			}
		}
	}
	var markers []chartMarker
	for _, ph := range rep.Phases {
		markers = append(markers, chartMarker{X: ph.StartS, Label: ph.Name, Color: black})
		add(key{ph.System, "background"}, ph.Background.Calls)
		for _, br := range ph.Bursts {
			markers = append(markers, chartMarker{X: br.FireS, Color: markGrey, Dash: DashDotted})
			add(key{ph.System, "burst"}, br.Calls)
		}
	}
	c := chart{
		Title:   fmt.Sprintf("torpor under bursts of %d calls to new functions, %g calls/s background; %s", rep.BurstSize, rep.Rate, machineLine(rep.Machine)),
		X:       chartAxis{Label: "time (s); dotted: a burst is released"},
		Y:       chartAxis{Label: "latency (ms, log scale)", Log: true},
		Markers: markers,
	}
	for _, k := range order {
		if len(series[k].X) > 0 {
			c.Series = append(c.Series, *series[k])
		}
	}
	return writeResults(dir, rep, func(w *bufio.Writer) error {
		fmt.Fprintf(w, "phase,kind,burst,send_s,%s\n", callCSVColumns)
		for _, ph := range rep.Phases {
			for _, tc := range ph.Background.Calls {
				fmt.Fprintf(w, "%s,background,,%.6f,%s\n", ph.Name, tc.SendS, callCSVFields(tc.res))
			}
			for _, br := range ph.Bursts {
				for _, tc := range br.Calls {
					fmt.Fprintf(w, "%s,burst,%d,%.6f,%s\n", ph.Name, br.Index, tc.SendS, callCSVFields(tc.res))
				}
			}
		}
		return nil
	}, map[string]func(io.Writer) error{"timeline.png": func(w io.Writer) error { return renderChart(w, c) }})
}

// msN formats microseconds as milliseconds, or "-" when no call succeeded.
func msN(n int, us int64) string {
	if n == 0 {
		return "-"
	}
	return ms(us)
}

// msF formats milliseconds with about three significant digits.
func msF(v float64) string { return ms3(int64(v * 1000)) }

// msPos is msF, or "-" for 0 (nothing measured).
func msPos(v float64) string {
	if v <= 0 {
		return "-"
	}
	return msF(v)
}
