package bench

import (
	"bufio"
	"context"
	"fmt"
	"image/color"
	"io"
	"net/http"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Series of the starts benchmark: one per start path, and the baseline
// (SeriesFork).
const (
	SeriesStartHot     = "torpor-hot"
	SeriesStartWarm    = "torpor-warm"
	SeriesStartCold    = "torpor-cold"
	SeriesStartColdNew = "torpor-cold-new"
)

// Defaults of StartsOptions.
const (
	DefaultStartsCalls    = 1000
	DefaultStartsWarmup   = 100
	DefaultStartsSamples  = 200
	DefaultStartsFresh    = 50
	DefaultStartsFunction = "bench-starts"
	// startsSampleWarmup is the unmeasured samples made before each
	// sampled series: the first drop or deploy of a run pays for caches
	// (the gateway's connection to the worker, code on disk) once.
	startsSampleWarmup = 3
)

// Targets of the fast-start work (issue 3), on p50 through HTTP.
const (
	TargetHotP50  = 350 * time.Microsecond
	TargetWarmP50 = 2 * time.Millisecond
	TargetColdP50 = 5 * time.Millisecond
)

// StartsOptions configures Starts.
type StartsOptions struct {
	PlatformOptions
	// Calls is the number of measured hot calls (made back to back).
	Calls int
	// Warmup is the number of unmeasured hot calls made first; negative
	// means none.
	Warmup int
	// Samples is the number of measured calls of the warm, cold and
	// baseline series; each is prepared (instances dropped) unmeasured.
	Samples int
	// Fresh is the number of cold calls to freshly deployed functions
	// (torpor-cold-new); negative means none.
	Fresh int
	// Function is the name the NOP function is deployed under.
	Function string
}

func (o *StartsOptions) normalize() error {
	if err := o.PlatformOptions.normalize("starts"); err != nil {
		return err
	}
	o.Calls = orDefault(o.Calls, DefaultStartsCalls)
	o.Warmup = max(orDefault(o.Warmup, DefaultStartsWarmup), 0)
	o.Samples = orDefault(o.Samples, DefaultStartsSamples)
	o.Fresh = max(orDefault(o.Fresh, DefaultStartsFresh), 0)
	if o.Calls < 1 || o.Samples < 1 {
		return errdefs.Invalid(fmt.Sprintf("bench starts: %d calls, %d samples: pass --calls and --samples 1 or more", o.Calls, o.Samples))
	}
	if o.Function == "" {
		o.Function = DefaultStartsFunction
	}
	return function.ValidateName(o.Function)
}

// orDefault returns v, or def when v is 0 (the options' "unset").
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// StartsReport is the outcome of the starts benchmark and the schema of
// its results.json.
type StartsReport struct {
	Kind            string         `json:"kind"` // "starts"
	Machine         Machine        `json:"machine"`
	Endpoint        string         `json:"endpoint"`
	Function        string         `json:"function"`
	FunctionVersion int            `json:"function_version"`
	Calls           int            `json:"calls"`
	Warmup          int            `json:"warmup"`
	Samples         int            `json:"samples"`
	Fresh           int            `json:"fresh"`
	StartedAt       time.Time      `json:"started_at"`
	FinishedAt      time.Time      `json:"finished_at"`
	Results         []StartSeries  `json:"results"` // in measurement order, the baseline first
	Targets         []StartsTarget `json:"targets"`
}

// StartsTarget is one target next to its measurement: met only when every
// call of the series took the path (else the p50 is of another path).
type StartsTarget struct {
	TargetCheck
	Series string `json:"series"`
	OnPath int    `json:"on_path"`
	N      int    `json:"n"`
}

// StartSeries is one series of the starts benchmark.
type StartSeries struct {
	SeriesResult
	// Path is the start path the series means to measure ("" for the
	// baseline) and OnPath how many of its calls reported it in
	// X-Torpor-Start.
	Path   string `json:"path,omitempty"`
	OnPath int    `json:"on_path"`
	// Method says how each call was made to take the path.
	Method string `json:"method"`
}

// Failures returns the number of failed measured calls.
func (r *StartsReport) Failures() int {
	n := 0
	for _, s := range r.Results {
		n += s.Failures
	}
	return n
}

// Starts measures the latency of each start path of a NOP Python function
// through torpor's REST API — hot (an idle instance), warm (forked from
// the function's template), cold (a function template forked from the
// runtime template, then an instance) — against a fork-per-call server
// measured in the same run, prints the tables to out and writes the raw
// results and a CDF plot to opts.OutDir. Failed calls are counted in the
// report (StartsReport.Failures), not returned as an error.
func Starts(ctx context.Context, opts StartsOptions, out io.Writer) (*StartsReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	p, py, machine, err := opts.start(ctx, "starts")
	if err != nil {
		return nil, err
	}
	rep := &StartsReport{
		Kind: "starts", Machine: machine, Endpoint: opts.Endpoint, Function: opts.Function,
		Calls: opts.Calls, Warmup: opts.Warmup, Samples: opts.Samples, Fresh: opts.Fresh,
		StartedAt: machine.Timestamp,
	}
	base, err := StartForkBaseline(ctx, py.Path, map[string]string{"/nop": forkNOPScript})
	if err != nil {
		return nil, err
	}
	defer base.Close()
	hc := newHTTPClient(1)
	defer hc.CloseIdleConnections()

	// The baseline: every call a fresh interpreter.
	fmt.Fprintf(out, "baseline: %s -I -S per call, at %s\n", py.Path, base.URL)
	bt := target{series: SeriesFork, url: base.URL + "/nop"}
	if _, _, err := runCalls(ctx, hc, bt, 5, 1); err != nil {
		return nil, err
	}
	calls, elapsed, err := runCalls(ctx, hc, bt, opts.Samples, 1)
	if err != nil {
		return nil, err
	}
	rep.add(out, bt, "", "a fresh `python -I -S -c` per call (fork, exec, interpreter start, handler, exit)", calls, elapsed)

	v, err := p.deploy(ctx, opts.Function, nopCode)
	if err != nil {
		return nil, fmt.Errorf("bench starts: %w", err)
	}
	rep.FunctionVersion = v
	fmt.Fprintf(out, "deployed %s version %d to %s\n", opts.Function, v, opts.Endpoint)

	// Hot: back to back, every call finds the instance the last one left.
	ht := p.invoke(SeriesStartHot, opts.Function)
	if _, _, err := runCalls(ctx, hc, ht, opts.Warmup, 1); err != nil {
		return nil, err
	}
	if calls, elapsed, err = runCalls(ctx, hc, ht, opts.Calls, 1); err != nil {
		return nil, err
	}
	rep.add(out, ht, "hot", fmt.Sprintf("back to back after %d warm-up calls", opts.Warmup), calls, elapsed)

	// Warm: the instances dropped, the function's template kept.
	wt := p.invoke(SeriesStartWarm, opts.Function)
	calls, err = sampleCalls(ctx, hc, opts.Samples, func(ctx context.Context, _ int) (target, func(), error) {
		_, err := p.drop(ctx, opts.Function, true)
		return wt, nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("bench starts: warm: %w", err)
	}
	rep.add(out, wt, "warm", "before each call: DELETE /v1/functions/"+opts.Function+"/instances?keep_templates=true", calls, 0)

	// Cold: instances and the function's template dropped; the runtime
	// template (an interpreter that has imported nothing of the function)
	// stays, as it does for any function a worker has never seen.
	ct := p.invoke(SeriesStartCold, opts.Function)
	calls, err = sampleCalls(ctx, hc, opts.Samples, func(ctx context.Context, _ int) (target, func(), error) {
		_, err := p.drop(ctx, opts.Function, false)
		return ct, nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("bench starts: cold: %w", err)
	}
	rep.add(out, ct, "cold", "before each call: DELETE /v1/functions/"+opts.Function+"/instances (templates too)", calls, 0)

	// Cold, new function: a function deployed just before (the deploy's
	// validation may leave a template or instance: dropped too), deleted
	// after, so that nothing of it but what the deploy put on the worker
	// can be cached.
	if opts.Fresh > 0 {
		id := runID(opts.Now())
		nt := target{series: SeriesStartColdNew, torpor: true}
		calls, err = sampleCalls(ctx, hc, opts.Fresh, func(ctx context.Context, i int) (target, func(), error) {
			name := fmt.Sprintf("bench-sn-%s-%04d", id, i)
			if _, err := p.deploy(ctx, name, nopCode); err != nil {
				return target{}, nil, err
			}
			cleanup := func() { _ = p.remove(context.WithoutCancel(ctx), name) }
			if _, err := p.drop(ctx, name, false); err != nil {
				cleanup()
				return target{}, nil, err
			}
			return p.invoke(SeriesStartColdNew, name), cleanup, nil
		})
		if err != nil {
			return nil, fmt.Errorf("bench starts: cold, new functions: %w", err)
		}
		rep.add(out, nt, "cold", "before each call: deploy a new function bench-sn-<run>-<i> and DELETE its instances and templates; after: delete it", calls, 0)
	}

	rep.FinishedAt = opts.Now().UTC()
	rep.finish()
	fmt.Fprintln(out)
	PrintStartsTable(out, rep)
	if opts.OutDir != "" {
		if err := WriteStartsResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,latency.png}\n", opts.OutDir)
	}
	return rep, nil
}

// sampleCalls makes n measured calls one at a time, each after prep
// (unmeasured) has readied the platform and said where the call goes; the
// cleanup prep returns, if any, runs after the call, also unmeasured.
// startsSampleWarmup unmeasured samples come first; prep gets the sample's
// index over both, so that it can name things uniquely. An error of prep
// ends the series: without it the samples would not measure the path.
func sampleCalls(ctx context.Context, hc *http.Client, n int, prep func(ctx context.Context, i int) (target, func(), error)) ([]callResult, error) {
	var out []callResult
	for i := 0; i < startsSampleWarmup+n; i++ {
		t, cleanup, err := prep(ctx, i)
		if err != nil {
			return nil, err
		}
		r := call(ctx, hc, t)
		if cleanup != nil {
			cleanup()
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if i >= startsSampleWarmup {
			out = append(out, r)
		}
	}
	return out, nil
}

// add summarizes one measured series and prints its progress line.
func (r *StartsReport) add(out io.Writer, t target, path, method string, calls []callResult, elapsed time.Duration) {
	s := StartSeries{SeriesResult: summarizeCalls(t, 1, calls, elapsed), Path: path, Method: method}
	if path != "" {
		s.OnPath = s.Starts[path]
	}
	r.Results = append(r.Results, s)
	fmt.Fprintf(out, "%-16s %5d calls: p50 %s ms, p99 %s ms, %d failed", s.Series, len(calls), ms(s.P50US), ms(s.P99US), s.Failures)
	if path != "" {
		fmt.Fprintf(out, ", %d of %d %s", s.OnPath, s.N, path)
	}
	fmt.Fprintln(out)
}

// finish computes the ratios to the baseline and checks the targets.
func (r *StartsReport) finish() {
	var base Summary
	for _, s := range r.Results {
		if s.Series == SeriesFork {
			base = s.Summary
		}
	}
	r.Targets = nil
	target := map[string]time.Duration{SeriesStartHot: TargetHotP50, SeriesStartWarm: TargetWarmP50, SeriesStartCold: TargetColdP50}
	for i := range r.Results {
		s := &r.Results[i]
		if s.Series == SeriesFork {
			continue
		}
		s.RatioP50, s.RatioP99 = Ratio(s.P50US, base.P50US), Ratio(s.P99US, base.P99US)
		if t, ok := target[s.Series]; ok {
			got := float64(s.P50US) / 1000
			r.Targets = append(r.Targets, StartsTarget{
				TargetCheck: TargetCheck{What: s.Path + " start p50", TargetMS: millis(t), GotMS: got, Met: s.N > 0 && s.OnPath == s.N && got <= millis(t)},
				Series:      s.Series, OnPath: s.OnPath, N: s.N,
			})
		}
	}
}

// PrintStartsTable prints the latency of each start path with its ratios
// to the fork-per-call baseline, the targets, torpor's Server-Timing split
// and the failures.
func PrintStartsTable(w io.Writer, rep *StartsReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-16s\tpath\tn\tfailed\ton path\tp50 ms\tp90 ms\tp99 ms\tmax ms\tp50/base\tp99/base\tbase/p50\t\n", "series")
	for _, s := range rep.Results {
		path, on, r50, r99, speed := "-", "-", "-", "-", "-"
		if s.Series != SeriesFork {
			path, on = s.Path, fmt.Sprintf("%d/%d", s.OnPath, s.N)
			r50, r99 = ratioSig(s.RatioP50), ratioSig(s.RatioP99)
			if s.RatioP50 > 0 {
				speed = ratioSig(1 / s.RatioP50)
			}
		}
		fmt.Fprintf(tw, "%-16s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Series, path, s.N, s.Failures, on,
			ms(s.P50US), ms(s.P90US), ms(s.P99US), ms(s.MaxUS), r50, r99, speed)
	}
	tw.Flush()
	for _, s := range rep.Results {
		if s.Path != "" && s.OnPath < s.N {
			fmt.Fprintf(w, "note: %d of %d %s calls did not report X-Torpor-Start: %s (%s): that series does not measure the %s path alone\n",
				s.N-s.OnPath, s.N, s.Series, s.Path, startMix(s.Starts), s.Path)
		}
	}

	fmt.Fprintln(w, "\ntargets (p50 through HTTP, client side):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-16s\t%-16s\ttarget ms\tmeasured ms\t\n", "what", "series")
	for _, t := range rep.Targets {
		met := "  MISSED"
		switch {
		case t.OnPath < t.N:
			met = fmt.Sprintf("  not measured: %d of %d calls on the path", t.OnPath, t.N)
		case t.Met:
			met = "  met"
		}
		fmt.Fprintf(tw, "%-16s\t%-16s\t%.2f\t%.3f\t%s\n", t.What, t.Series, t.TargetMS, t.GotMS, met)
	}
	tw.Flush()

	fmt.Fprintln(w, "\ntorpor's Server-Timing of the same calls, ms (start: obtain the instance; handler: round trip to it; rest = latency - start - handler):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-16s\tstart p50\tstart p99\thandler p50\thandler p99\trest p50\t\n", "series")
	for _, s := range rep.Results {
		if len(s.ServerStartUS) == 0 {
			continue
		}
		rest := "-"
		if len(s.ServerStartUS) == len(s.LatenciesUS) {
			v := make([]int64, len(s.LatenciesUS))
			for i := range v {
				v[i] = s.LatenciesUS[i] - s.ServerStartUS[i] - s.ServerHandlerUS[i]
			}
			rest = ms(Percentile(v, 50))
		}
		fmt.Fprintf(tw, "%-16s\t%s\t%s\t%s\t%s\t%s\t\n", s.Series, ms(Percentile(s.ServerStartUS, 50)), ms(Percentile(s.ServerStartUS, 99)),
			ms(Percentile(s.ServerHandlerUS, 50)), ms(Percentile(s.ServerHandlerUS, 99)), rest)
	}
	tw.Flush()

	fmt.Fprintln(w, "\nhow each series was made to take its path:")
	for _, s := range rep.Results {
		fmt.Fprintf(w, "  %-16s %s\n", s.Series, s.Method)
	}
	var groups []errorGroup
	for _, s := range rep.Results {
		groups = append(groups, errorGroup{s.Series, s.Failures, s.Errors})
	}
	printFailures(w, groups)
}

// ratioSig formats a ratio with two significant digits, so that 0.023x
// (torpor 40 times faster than the baseline) is not printed as 0.02x.
func ratioSig(r float64) string {
	if r <= 0 {
		return "-"
	}
	if r >= 10 {
		return strconv.FormatFloat(r, 'f', 0, 64) + "x"
	}
	return strconv.FormatFloat(r, 'g', 2, 64) + "x"
}

// WriteStartsResults writes results.json (the report), results.csv (one
// row per measured call) and latency.png (the CDFs) to dir.
func WriteStartsResults(dir string, rep *StartsReport) error {
	var lines []PlotLine
	colors := map[string]color.RGBA{SeriesFork: Palette[9], SeriesStartHot: Palette[2], SeriesStartWarm: Palette[0], SeriesStartCold: Palette[1], SeriesStartColdNew: Palette[3]}
	for _, s := range rep.Results {
		dash := DashSolid
		if s.Series == SeriesStartColdNew {
			dash = DashDashed
		}
		lines = append(lines, PlotLine{
			Label:       fmt.Sprintf("%-16s p50 %-5s p99 %s ms", s.Series, ms3(s.P50US), ms3(s.P99US)),
			LatenciesUS: s.LatenciesUS, Color: colors[s.Series], Dash: dash,
		})
	}
	title := fmt.Sprintf("torpor start paths of a NOP python function vs fork-per-call; %s", machineLine(rep.Machine))
	return writeResults(dir, rep,
		func(w *bufio.Writer) error {
			fmt.Fprintf(w, "series,i,%s\n", callCSVColumns)
			for _, s := range rep.Results {
				for i, c := range s.calls {
					fmt.Fprintf(w, "%s,%d,%s\n", s.Series, i, callCSVFields(c))
				}
			}
			return nil
		},
		map[string]func(io.Writer) error{"latency.png": func(w io.Writer) error { return RenderCDF(w, title, lines) }})
}
