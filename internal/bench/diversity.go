package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults of DiversityOptions.
const (
	DefaultDiversityCalls         = 2000
	DefaultDiversityConcurrency   = 32
	DefaultDiversityMinFunctions  = 64
	DefaultDiversityMaxFunctions  = 1024
	DefaultDiversityBaselineCalls = 500
	diversityPrefix               = "bench-v-"
)

// DiversityOptions configures Diversity.
type DiversityOptions struct {
	PlatformOptions
	// Calls is the number of measured calls per number of functions.
	Calls int
	// Concurrency is the number of clients, each a closed loop.
	Concurrency int
	// MinFunctions and MaxFunctions bound the numbers of functions the
	// calls are spread over: MinFunctions, then doubling while <= Max.
	MinFunctions, MaxFunctions int
	// BaselineCalls is the number of calls made to the baseline.
	BaselineCalls int
	// Seed fixes the random choice of function of every call.
	Seed uint64
}

func (o *DiversityOptions) normalize() error {
	if err := o.PlatformOptions.normalize("diversity"); err != nil {
		return err
	}
	o.Calls = orDefault(o.Calls, DefaultDiversityCalls)
	o.Concurrency = orDefault(o.Concurrency, DefaultDiversityConcurrency)
	o.MinFunctions = orDefault(o.MinFunctions, DefaultDiversityMinFunctions)
	o.MaxFunctions = orDefault(o.MaxFunctions, DefaultDiversityMaxFunctions)
	o.BaselineCalls = orDefault(o.BaselineCalls, DefaultDiversityBaselineCalls)
	if o.Seed == 0 {
		o.Seed = 1
	}
	switch {
	case o.Calls < 1 || o.BaselineCalls < 1:
		return errdefs.Invalid(fmt.Sprintf("bench diversity: %d calls, %d baseline calls: use 1 or more", o.Calls, o.BaselineCalls))
	case o.Concurrency < 1 || o.Concurrency > 1000:
		return errdefs.Invalid(fmt.Sprintf("bench diversity: concurrency %d: use 1-1000", o.Concurrency))
	case o.MinFunctions < 1 || o.MaxFunctions < o.MinFunctions || o.MaxFunctions > 9999:
		return errdefs.Invalid(fmt.Sprintf("bench diversity: functions %d-%d: use 1 <= --min-functions <= --max-functions <= 9999", o.MinFunctions, o.MaxFunctions))
	}
	return nil
}

// DiversityLevel is the load spread over one number of functions.
type DiversityLevel struct {
	Functions int `json:"functions"`
	Summary
	// Starts counts X-Torpor-Start values (torpor only).
	Starts map[string]int `json:"starts,omitempty"`
	// Ratios to the baseline (torpor / baseline).
	RatioThroughput float64  `json:"ratio_throughput,omitempty"`
	RatioP50        float64  `json:"ratio_p50,omitempty"`
	RatioP99        float64  `json:"ratio_p99,omitempty"`
	Errors          []string `json:"errors,omitempty"`
	// The workers after the load: every template's and instance's PSS
	// (bytes), and the least memory available on one.
	PSS            int64   `json:"pss"`
	MemAvailableMB int     `json:"mem_available_mb"`
	ElapsedS       float64 `json:"elapsed_s"`
	// LatenciesUS and FunctionIndex are every successful call's latency
	// and the function it called (0-based), in issue order.
	LatenciesUS   []int64 `json:"latencies_us"`
	FunctionIndex []int   `json:"function_index"`

	calls []callResult
	fns   []int
}

// DiversityReport is the outcome of the diversity benchmark and the schema
// of its results.json.
type DiversityReport struct {
	Kind          string           `json:"kind"` // "diversity"
	Machine       Machine          `json:"machine"`
	Endpoint      string           `json:"endpoint"`
	Calls         int              `json:"calls"`
	Concurrency   int              `json:"concurrency"`
	BaselineCalls int              `json:"baseline_calls"`
	Seed          uint64           `json:"seed"`
	StartedAt     time.Time        `json:"started_at"`
	FinishedAt    time.Time        `json:"finished_at"`
	Baseline      DiversityLevel   `json:"baseline"`
	Levels        []DiversityLevel `json:"levels"`
	// StopReason says why the number of functions stopped doubling
	// before MaxFunctions, if it did.
	StopReason string `json:"stop_reason,omitempty"`
}

// Failures returns the number of failed measured calls.
func (r *DiversityReport) Failures() int {
	n := r.Baseline.Failures
	for _, l := range r.Levels {
		n += l.Failures
	}
	return n
}

// Diversity spreads opts.Calls calls uniformly at random over M unique NOP
// functions from opts.Concurrency closed-loop clients, for M from
// MinFunctions doubling up to MaxFunctions (SEUSS §8, Fig. 6-7), each M
// starting with no instance or template of any function cached; it
// measures the same load against the fork-per-call baseline, prints the
// tables to out, writes the results to opts.OutDir and deletes the
// functions. Failed calls are counted in the report, not returned.
func Diversity(ctx context.Context, opts DiversityOptions, out io.Writer) (*DiversityReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	p, py, machine, err := opts.start(ctx, "diversity")
	if err != nil {
		return nil, err
	}
	rep := &DiversityReport{Kind: "diversity", Machine: machine, Endpoint: opts.Endpoint, Calls: opts.Calls,
		Concurrency: opts.Concurrency, BaselineCalls: opts.BaselineCalls, Seed: opts.Seed, StartedAt: machine.Timestamp}
	hc := newHTTPClient(opts.Concurrency)
	defer hc.CloseIdleConnections()

	// The baseline serves every function the same way, a process per call,
	// so its cost does not depend on M: it is measured once, at the
	// smallest M.
	base, err := StartForkBaseline(ctx, py.Path, map[string]string{"/nop": forkNOPScript})
	if err != nil {
		return nil, err
	}
	defer base.Close()
	fmt.Fprintf(out, "baseline: %s -I -S per call, at %s: %d calls over %d functions, %d clients ... ", py.Path, base.URL, opts.BaselineCalls, opts.MinFunctions, opts.Concurrency)
	baseFor := func(i int) target {
		return target{series: SeriesFork, url: fmt.Sprintf("%s/nop?fn=%s%04d", base.URL, diversityPrefix, i+1)}
	}
	seq := randomSeq(opts.Seed, opts.MinFunctions, opts.BaselineCalls)
	if _, _, err := runMixed(ctx, hc, func(i int) target { return baseFor(i % opts.MinFunctions) }, opts.Concurrency, opts.Concurrency); err != nil {
		return nil, err
	}
	calls, elapsed, err := runMixed(ctx, hc, func(i int) target { return baseFor(seq[i]) }, opts.BaselineCalls, opts.Concurrency)
	if err != nil {
		return nil, err
	}
	rep.Baseline = diversityLevel(opts.MinFunctions, calls, seq, elapsed, false)
	fmt.Fprintf(out, "%.0f calls/s, p50 %s ms\n", rep.Baseline.Throughput, ms(rep.Baseline.P50US))
	base.Close()

	if n, err := p.removePrefix(ctx, diversityPrefix); err != nil {
		return nil, fmt.Errorf("bench diversity: remove the functions of an earlier run: %w", err)
	} else if n > 0 {
		fmt.Fprintf(out, "deleted %d %s* functions left by an earlier run\n", n, diversityPrefix)
	}
	var names []string
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := p.removeAll(cctx, names); err != nil {
			fmt.Fprintf(out, "cleanup: %v (delete the %s* functions by hand)\n", err, diversityPrefix)
		} else if len(names) > 0 {
			fmt.Fprintf(out, "deleted the %d functions deployed\n", len(names))
		}
	}()

	for m := opts.MinFunctions; m <= opts.MaxFunctions; m *= 2 {
		// Deploy up to m functions, a few at a time.
		have := len(names)
		for i := have; i < m; i++ {
			names = append(names, fmt.Sprintf("%s%04d", diversityPrefix, i+1))
		}
		fmt.Fprintf(out, "M=%-5d deploy %d more ... ", m, m-have)
		t0 := time.Now()
		if err := forEach(ctx, m-have, 4, func(ctx context.Context, i int) error {
			_, err := p.deploy(ctx, names[have+i], nopCode)
			return err
		}); err != nil {
			names = names[:have+countDeployed(ctx, p, names[have:])]
			if refused(err) && len(rep.Levels) > 0 {
				fmt.Fprintln(out)
				rep.StopReason = fmt.Sprintf("M=%d: a deploy was refused: %v", m, err)
				break
			}
			return rep, fmt.Errorf("bench diversity: %w", err)
		}
		// Every M starts from nothing cached: the first call of each
		// function is a cold start, as in SEUSS's runs.
		if err := forEach(ctx, m, 8, func(ctx context.Context, i int) error {
			_, err := p.drop(ctx, names[i], false)
			return err
		}); err != nil {
			return rep, fmt.Errorf("bench diversity: drop the instances and templates of the functions: %w", err)
		}
		fmt.Fprintf(out, "%.1fs; %d calls, %d clients ... ", time.Since(t0).Seconds(), opts.Calls, opts.Concurrency)

		seq := randomSeq(opts.Seed, m, opts.Calls)
		targets := make([]target, m)
		for i := range targets {
			targets[i] = p.invoke("torpor", names[i])
		}
		calls, elapsed, err := runMixed(ctx, hc, func(i int) target { return targets[seq[i]] }, opts.Calls, opts.Concurrency)
		if err != nil {
			return rep, err
		}
		l := diversityLevel(m, calls, seq, elapsed, true)
		infos, err := p.allWorkers(ctx)
		if err != nil {
			return rep, fmt.Errorf("bench diversity: %w", err)
		}
		pt := densityPoint(0, "", infos)
		l.PSS, l.MemAvailableMB = pt.PSS, pt.MemAvailableMB
		rep.Levels = append(rep.Levels, l)
		fmt.Fprintf(out, "%.0f calls/s, p50 %s ms, p99 %s ms, %d failed; %s\n", l.Throughput, ms(l.P50US), ms(l.P99US), l.Failures, startMix(l.Starts))
		if pt.LowWatermarkMB > 0 && pt.MemAvailableMB < pt.LowWatermarkMB {
			rep.StopReason = fmt.Sprintf("M=%d: %d MiB available, below the reclaimer's low watermark of %d MiB: memory ran out", m, pt.MemAvailableMB, pt.LowWatermarkMB)
			break
		}
	}
	rep.FinishedAt = opts.Now().UTC()
	for i := range rep.Levels {
		l := &rep.Levels[i]
		l.RatioThroughput = ratioF(l.Throughput, rep.Baseline.Throughput)
		l.RatioP50, l.RatioP99 = Ratio(l.P50US, rep.Baseline.P50US), Ratio(l.P99US, rep.Baseline.P99US)
	}

	fmt.Fprintln(out)
	PrintDiversityTable(out, rep)
	if opts.OutDir != "" {
		if err := WriteDiversityResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,throughput.png}\n", opts.OutDir)
	}
	return rep, nil
}

// countDeployed returns how many of names exist, after a failed batch of
// deploys, so that the cleanup knows them (the names are deployed in
// order but concurrently: it checks them all).
func countDeployed(ctx context.Context, p *platform, names []string) int {
	fns, err := p.cli.Functions(ctx)
	if err != nil {
		return len(names) // delete them all: deleting a missing one is no error
	}
	exists := map[string]bool{}
	for _, f := range fns {
		exists[f.Name] = true
	}
	n := 0
	for i, name := range names {
		if exists[name] {
			n = i + 1
		}
	}
	return n
}

// randomSeq returns n function indexes drawn uniformly from [0, m), the
// same for the same seed and m.
func randomSeq(seed uint64, m, n int) []int {
	rng := rand.New(rand.NewPCG(seed, uint64(m)))
	seq := make([]int, n)
	for i := range seq {
		seq[i] = rng.IntN(m)
	}
	return seq
}

// diversityLevel summarizes the calls of one M.
func diversityLevel(m int, calls []callResult, seq []int, elapsed time.Duration, torpor bool) DiversityLevel {
	l := DiversityLevel{Functions: m, calls: calls, fns: seq[:len(calls)], ElapsedS: elapsed.Seconds()}
	var errs errorSet
	for i, c := range calls {
		if c.err != nil {
			errs.add("", c.err)
			continue
		}
		l.LatenciesUS = append(l.LatenciesUS, c.latency.Microseconds())
		l.FunctionIndex = append(l.FunctionIndex, seq[i])
	}
	if torpor {
		l.Starts = startsOf(calls)
	}
	l.Summary = Summarize(l.LatenciesUS, errs.N, elapsed)
	l.Errors = errs.Messages
	return l
}

// ratioF returns a/b, or 0 when b is 0.
func ratioF(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// PrintDiversityTable prints throughput, latency and start paths per M
// with their ratios to the baseline.
func PrintDiversityTable(w io.Writer, rep *DiversityReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-14s\tM\tn\tfailed\tcalls/s\tp50 ms\tp99 ms\tmax ms\tcalls/s / base\tp50/base\tp99/base\tworkers' PSS MiB\t  start paths\n", "series")
	b := rep.Baseline
	fmt.Fprintf(tw, "%-14s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t-\t-\t-\t-\t  -\n", SeriesFork, b.Functions, b.N, b.Failures, b.Throughput, ms(b.P50US), ms(b.P99US), ms(b.MaxUS))
	for _, l := range rep.Levels {
		fmt.Fprintf(tw, "%-14s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t  %s\n", "torpor", l.Functions, l.N, l.Failures, l.Throughput,
			ms(l.P50US), ms(l.P99US), ms(l.MaxUS), ratioSig(l.RatioThroughput), ratioSig(l.RatioP50), ratioSig(l.RatioP99), mib(l.PSS), startMix(l.Starts))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d calls per M from %d closed-loop clients, each to one of M functions drawn uniformly (seed %d); every M starts with nothing cached.\n",
		rep.Calls, rep.Concurrency, rep.Seed)
	fmt.Fprintf(w, "The baseline forks an interpreter per call whatever M is: it is measured once, %d calls.\n", rep.BaselineCalls)
	if rep.StopReason != "" {
		fmt.Fprintf(w, "stopped before --max-functions: %s\n", rep.StopReason)
	}
	groups := []errorGroup{{SeriesFork, b.Failures, b.Errors}}
	for _, l := range rep.Levels {
		groups = append(groups, errorGroup{fmt.Sprintf("torpor M=%d", l.Functions), l.Failures, l.Errors})
	}
	printFailures(w, groups)
}

// WriteDiversityResults writes results.json (the report), results.csv
// (one row per measured call) and throughput.png to dir.
func WriteDiversityResults(dir string, rep *DiversityReport) error {
	var x, y, by, ticks []float64
	for _, l := range rep.Levels {
		x, y = append(x, float64(l.Functions)), append(y, l.Throughput)
		by = append(by, rep.Baseline.Throughput)
		ticks = append(ticks, float64(l.Functions))
	}
	c := chart{
		Title: fmt.Sprintf("torpor throughput, %d clients, calls spread over M NOP functions; %s", rep.Concurrency, machineLine(rep.Machine)),
		X:     chartAxis{Label: "M: unique functions (log scale)", Log: true, Ticks: ticks},
		Y:     chartAxis{Label: "calls per second"},
		Series: []chartSeries{
			{Label: "torpor", X: x, Y: y, Color: Palette[0], Line: true, Dot: 5},
			{Label: "baseline: fork-per-call (independent of M)", X: x, Y: by, Color: Palette[9], Line: true, Dash: DashDashed},
		},
	}
	return writeResults(dir, rep, func(w *bufio.Writer) error {
		fmt.Fprintf(w, "series,functions,i,function,%s\n", callCSVColumns)
		write := func(series string, l DiversityLevel) {
			for i, c := range l.calls {
				fmt.Fprintf(w, "%s,%d,%d,%s%04d,%s\n", series, l.Functions, i, diversityPrefix, l.fns[i]+1, callCSVFields(c))
			}
		}
		write(SeriesFork, rep.Baseline)
		for _, l := range rep.Levels {
			write("torpor", l)
		}
		return nil
	}, map[string]func(io.Writer) error{"throughput.png": func(w io.Writer) error { return renderChart(w, c) }})
}
