package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults of BurstsOptions.
const (
	DefaultBurstsPhase            = 64 * time.Second
	DefaultBurstsSize             = 128
	DefaultBurstsRate             = 20.0
	DefaultBurstsBaselineDuration = 32 * time.Second
	DefaultBurstsLead             = 2 * time.Second
	burstsSleepFunction           = "bench-bursts-sleep"
	burstsPrefix                  = "bench-b-"
)

// DefaultBurstsIntervals are the times between bursts of the phases, the
// shape of SEUSS §8.4 (bursts every 32 s, 16 s, then 8 s).
var DefaultBurstsIntervals = []time.Duration{32 * time.Second, 16 * time.Second, 8 * time.Second}

// BurstsOptions configures Bursts.
type BurstsOptions struct {
	PlatformOptions
	// PhaseDuration is the length of each torpor phase.
	PhaseDuration time.Duration
	// Intervals are the times between bursts, one phase each, in order.
	Intervals []time.Duration
	// BurstSize is the number of parallel calls of a burst.
	BurstSize int
	// Rate is the background's calls per second, sent open-loop (on a
	// schedule, whether earlier calls have answered or not).
	Rate float64
	// BaselineDuration is the length of the baseline phase, which bursts
	// at the shortest of Intervals.
	BaselineDuration time.Duration
	// Lead is how long before its burst the burst's function is deployed.
	Lead time.Duration
}

func (o *BurstsOptions) normalize() error {
	if err := o.PlatformOptions.normalize("bursts"); err != nil {
		return err
	}
	if o.PhaseDuration == 0 {
		o.PhaseDuration = DefaultBurstsPhase
	}
	if len(o.Intervals) == 0 {
		o.Intervals = DefaultBurstsIntervals
	}
	o.BurstSize = orDefault(o.BurstSize, DefaultBurstsSize)
	if o.Rate == 0 {
		o.Rate = DefaultBurstsRate
	}
	if o.BaselineDuration == 0 {
		o.BaselineDuration = DefaultBurstsBaselineDuration
	}
	if o.Lead == 0 {
		o.Lead = DefaultBurstsLead
	}
	shortest := slices.Min(o.Intervals)
	switch {
	case shortest <= 0 || slices.Max(o.Intervals) > o.PhaseDuration || shortest > o.BaselineDuration:
		return errdefs.Invalid(fmt.Sprintf("bench bursts: intervals %v: use intervals > 0, none longer than --phase-duration %s, the shortest no longer than --baseline-duration %s",
			o.Intervals, o.PhaseDuration, o.BaselineDuration))
	case o.BurstSize < 1 || o.BurstSize > 1000:
		return errdefs.Invalid(fmt.Sprintf("bench bursts: burst of %d calls: use 1-1000", o.BurstSize))
	case o.Rate <= 0 || o.Rate > 1000:
		return errdefs.Invalid(fmt.Sprintf("bench bursts: background rate %g: use more than 0 and at most 1000 calls/s", o.Rate))
	case o.Lead < 0 || o.Lead >= shortest:
		return errdefs.Invalid(fmt.Sprintf("bench bursts: lead %s: use 0 or more, less than the shortest interval %s", o.Lead, shortest))
	}
	return nil
}

// TimedCall is one call on the run's time line.
type TimedCall struct {
	SendS     float64 `json:"send_s"` // since the first phase began
	LatencyUS int64   `json:"latency_us"`
	OK        bool    `json:"ok"`
	Start     string  `json:"start,omitempty"` // X-Torpor-Start

	res callResult
}

// BurstResult is one burst.
type BurstResult struct {
	Index    int    `json:"index"`
	Function string `json:"function,omitempty"` // torpor's freshly deployed function
	// FireS is when the calls were released, PrepMS how long the deploy
	// (and drop) of the function took before.
	FireS  float64 `json:"fire_s"`
	PrepMS float64 `json:"prep_ms"`
	Summary
	// CompletionMS is from the release of the calls to the last answer.
	CompletionMS float64        `json:"completion_ms"`
	Starts       map[string]int `json:"starts,omitempty"`
	Errors       []string       `json:"errors,omitempty"`
	Calls        []TimedCall    `json:"calls"`
}

// BackgroundResult is the background calls sent during one phase.
type BackgroundResult struct {
	Summary
	// Quiet are the calls that overlapped no burst, InBurst the others.
	Quiet   Summary        `json:"quiet"`
	InBurst Summary        `json:"in_burst"`
	Starts  map[string]int `json:"starts,omitempty"`
	Errors  []string       `json:"errors,omitempty"`
	Calls   []TimedCall    `json:"calls"`
}

// BurstsPhase is one phase: a background and bursts at one interval.
type BurstsPhase struct {
	Name      string  `json:"name"`
	System    string  `json:"system"` // "torpor" or SeriesFork
	IntervalS float64 `json:"interval_s"`
	StartS    float64 `json:"start_s"`
	EndS      float64 `json:"end_s"` // when its last call answered
	// AllBursts summarizes every call of every burst of the phase.
	AllBursts          Summary          `json:"all_bursts"`
	CompletionP50MS    float64          `json:"completion_p50_ms"`
	CompletionMaxMS    float64          `json:"completion_max_ms"`
	RatioBurstP50      float64          `json:"ratio_burst_p50,omitempty"` // torpor / baseline
	RatioBurstP99      float64          `json:"ratio_burst_p99,omitempty"`
	RatioCompletion    float64          `json:"ratio_completion,omitempty"` // of CompletionP50MS
	RatioBackgroundP99 float64          `json:"ratio_background_p99,omitempty"`
	Bursts             []*BurstResult   `json:"bursts"`
	Background         BackgroundResult `json:"background"`
}

// BurstsReport is the outcome of the bursts benchmark and the schema of
// its results.json.
type BurstsReport struct {
	Kind               string         `json:"kind"` // "bursts"
	Machine            Machine        `json:"machine"`
	Endpoint           string         `json:"endpoint"`
	PhaseDurationS     float64        `json:"phase_duration_s"`
	BaselineDurationS  float64        `json:"baseline_duration_s"`
	BurstSize          int            `json:"burst_size"`
	Rate               float64        `json:"rate"`
	LeadS              float64        `json:"lead_s"`
	BackgroundFunction string         `json:"background_function"`
	StartedAt          time.Time      `json:"started_at"`
	FinishedAt         time.Time      `json:"finished_at"`
	Phases             []*BurstsPhase `json:"phases"` // torpor's, then the baseline's
}

// Failures returns the number of failed calls, bursts and background.
func (r *BurstsReport) Failures() int {
	n := 0
	for _, ph := range r.Phases {
		n += ph.Background.Failures
		for _, b := range ph.Bursts {
			n += b.Failures
		}
	}
	return n
}

// burstsRun is the state of one Bursts run.
type burstsRun struct {
	opts BurstsOptions
	hc   *http.Client
	t0   time.Time // the time line's origin
	out  io.Writer
}

func (b *burstsRun) since() float64 { return time.Since(b.t0).Seconds() }

// burstPrep readies burst k of a phase: it returns where the calls go,
// the function deployed for it ("" for none) and what to do once the
// burst is over (nil for nothing).
type burstPrep func(ctx context.Context, k int) (target, string, func(), error)

// Bursts runs a steady open-loop background of IO-bound calls (a function
// sleeping 50 ms) and, in one phase per interval, bursts of parallel calls
// to a never-seen NOP function deployed just before each burst (SEUSS
// §8.4, scaled to a small machine); then the same against the
// fork-per-call baseline. It prints the tables to out and writes the
// results and a time-line plot to opts.OutDir. Failed calls are counted
// in the report (BurstsReport.Failures), not returned as an error.
func Bursts(ctx context.Context, opts BurstsOptions, out io.Writer) (*BurstsReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	p, py, machine, err := opts.start(ctx, "bursts")
	if err != nil {
		return nil, err
	}
	rep := &BurstsReport{Kind: "bursts", Machine: machine, Endpoint: opts.Endpoint, PhaseDurationS: opts.PhaseDuration.Seconds(),
		BaselineDurationS: opts.BaselineDuration.Seconds(), BurstSize: opts.BurstSize, Rate: opts.Rate, LeadS: opts.Lead.Seconds(),
		BackgroundFunction: burstsSleepFunction, StartedAt: machine.Timestamp}
	base, err := StartForkBaseline(ctx, py.Path, map[string]string{"/nop": forkNOPScript, "/sleep": forkSleepScript})
	if err != nil {
		return nil, err
	}
	defer base.Close()
	b := &burstsRun{opts: opts, hc: newHTTPClient(2*opts.BurstSize + 64), out: out}
	defer b.hc.CloseIdleConnections()

	if _, err := p.deploy(ctx, burstsSleepFunction, sleepCode); err != nil {
		return nil, fmt.Errorf("bench bursts: %w", err)
	}
	defer func() { _ = p.remove(context.WithoutCancel(ctx), burstsSleepFunction) }()
	bg := p.invoke("background", burstsSleepFunction)
	if _, _, err := runCalls(ctx, b.hc, bg, 10, 2); err != nil { // instances for the background
		return nil, err
	}
	if n, err := p.removePrefix(ctx, burstsPrefix); err != nil {
		return nil, fmt.Errorf("bench bursts: remove the functions of an earlier run: %w", err)
	} else if n > 0 {
		fmt.Fprintf(out, "deleted %d %s* functions left by an earlier run\n", n, burstsPrefix)
	}

	total := time.Duration(len(opts.Intervals))*opts.PhaseDuration + opts.BaselineDuration
	fmt.Fprintf(out, "background: %s (sleeps 50 ms) at %g calls/s; bursts of %d calls; %d phases, about %s\n",
		burstsSleepFunction, opts.Rate, opts.BurstSize, len(opts.Intervals)+1, total.Round(time.Second))
	id := runID(opts.Now())
	b.t0 = time.Now()
	for i, iv := range opts.Intervals {
		ph := &BurstsPhase{Name: fmt.Sprintf("torpor every %s", iv), System: "torpor", IntervalS: iv.Seconds()}
		rep.Phases = append(rep.Phases, ph)
		prep := func(ctx context.Context, k int) (target, string, func(), error) {
			name := fmt.Sprintf("%s%s-%d-%02d", burstsPrefix, id, i+1, k+1)
			if _, err := p.deploy(ctx, name, nopCode); err != nil {
				return target{}, name, nil, err
			}
			cleanup := func() { _ = p.remove(context.WithoutCancel(ctx), name) }
			// The deploy's validation may leave a template or an instance
			// on a worker: the burst must find nothing of the function.
			if _, err := p.drop(ctx, name, false); err != nil {
				return target{}, name, cleanup, err
			}
			return p.invoke("burst", name), name, cleanup, nil
		}
		if err := b.phase(ctx, ph, iv, opts.PhaseDuration, bg, prep); err != nil {
			return rep, err
		}
	}
	shortest := slices.Min(opts.Intervals)
	ph := &BurstsPhase{Name: fmt.Sprintf("%s every %s", SeriesFork, shortest), System: SeriesFork, IntervalS: shortest.Seconds()}
	rep.Phases = append(rep.Phases, ph)
	forkBurst := target{series: SeriesFork, url: base.URL + "/nop"}
	if err := b.phase(ctx, ph, shortest, opts.BaselineDuration, target{series: SeriesFork, url: base.URL + "/sleep"},
		func(context.Context, int) (target, string, func(), error) { return forkBurst, "", nil, nil }); err != nil {
		return rep, err
	}
	rep.FinishedAt = opts.Now().UTC()
	rep.finish()

	fmt.Fprintln(out)
	PrintBurstsTables(out, rep)
	if opts.OutDir != "" {
		if err := WriteBurstsResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,timeline.png}\n", opts.OutDir)
	}
	return rep, nil
}

// phase runs one phase of length dur: the background sent to bg on its
// schedule from the start, and a burst at interval/2, then every
// interval, while before the end; it returns once every call answered.
func (b *burstsRun) phase(ctx context.Context, ph *BurstsPhase, interval, dur time.Duration, bg target, prep burstPrep) error {
	start := time.Now()
	end := start.Add(dur)
	ph.StartS = start.Sub(b.t0).Seconds()
	fmt.Fprintf(b.out, "%-28s from %6.1fs: ", ph.Name, ph.StartS)

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		back []TimedCall
	)
	wg.Add(1)
	go func() { // the background, open loop: one goroutine per call
		defer wg.Done()
		period := time.Duration(float64(time.Second) / b.opts.Rate)
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i) * period)
			if !at.Before(end) || sleepUntil(ctx, at) != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				tc := b.timedCall(ctx, bg)
				mu.Lock()
				back = append(back, tc)
				mu.Unlock()
			}()
		}
	}()

	for k := 0; ; k++ {
		fire := start.Add(interval/2 + time.Duration(k)*interval)
		if !fire.Before(end) {
			break
		}
		if err := sleepUntil(ctx, fire.Add(-b.opts.Lead)); err != nil {
			break
		}
		br := &BurstResult{Index: k + 1}
		ph.Bursts = append(ph.Bursts, br)
		t0 := time.Now()
		t, name, cleanup, err := prep(ctx, k)
		br.Function, br.PrepMS = name, millisSince(t0)
		if err != nil {
			// The burst cannot be made: all its calls count as failed.
			if cleanup != nil {
				cleanup()
			}
			br.Summary = Summarize(nil, b.opts.BurstSize, 0)
			br.Errors = []string{"prepare the burst: " + err.Error()}
			br.FireS = fire.Sub(b.t0).Seconds()
			fmt.Fprintf(b.out, "burst %d FAILED ", k+1)
			continue
		}
		if err := sleepUntil(ctx, fire); err != nil {
			if cleanup != nil {
				cleanup()
			}
			break
		}
		release := make(chan struct{})
		calls := make([]TimedCall, b.opts.BurstSize)
		var bwg sync.WaitGroup
		for j := range calls {
			bwg.Add(1)
			go func() {
				defer bwg.Done()
				<-release
				calls[j] = b.timedCall(ctx, t)
			}()
		}
		fired := time.Now()
		br.FireS = fired.Sub(b.t0).Seconds()
		close(release)
		wg.Add(1)
		go func() {
			defer wg.Done()
			bwg.Wait()
			br.CompletionMS = millisSince(fired)
			br.summarize(calls)
			if cleanup != nil {
				cleanup()
			}
		}()
		fmt.Fprintf(b.out, "burst %d at %.1fs ", k+1, br.FireS)
	}
	_ = sleepUntil(ctx, end)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		fmt.Fprintln(b.out)
		return err
	}
	ph.EndS = b.since()
	slices.SortFunc(back, func(a, c TimedCall) int { return cmp.Compare(a.SendS, c.SendS) })
	ph.Background = backgroundResult(back, ph.Bursts)
	failed := ph.Background.Failures
	for _, br := range ph.Bursts {
		failed += br.Failures
	}
	fmt.Fprintf(b.out, "done at %.1fs, %d failed\n", ph.EndS, failed)
	return nil
}

// timedCall makes one call and places it on the time line.
func (b *burstsRun) timedCall(ctx context.Context, t target) TimedCall {
	s := b.since()
	r := call(ctx, b.hc, t)
	return TimedCall{SendS: s, LatencyUS: r.latency.Microseconds(), OK: r.err == nil, Start: r.start, res: r}
}

// summarize fills a burst's statistics from its calls.
func (br *BurstResult) summarize(calls []TimedCall) {
	br.Calls = calls
	var lat []int64
	var errs errorSet
	res := make([]callResult, len(calls))
	for i, c := range calls {
		res[i] = c.res
		if c.OK {
			lat = append(lat, c.LatencyUS)
		} else {
			errs.add("", c.res.err)
		}
	}
	br.Summary = Summarize(lat, errs.N, time.Duration(br.CompletionMS*float64(time.Millisecond)))
	br.Errors = errs.Messages
	br.Starts = startsOf(res)
	if len(br.Starts) == 1 && br.Starts["unknown"] > 0 {
		br.Starts = nil // the baseline's
	}
}

// backgroundResult summarizes the background calls of a phase, split by
// whether each overlapped a burst (from its release to its last answer).
func backgroundResult(calls []TimedCall, bursts []*BurstResult) BackgroundResult {
	var all, quiet, in []int64
	var errs errorSet
	res := make([]callResult, len(calls))
	for i, c := range calls {
		res[i] = c.res
		if !c.OK {
			errs.add("", c.res.err)
			continue
		}
		all = append(all, c.LatencyUS)
		endS := c.SendS + float64(c.LatencyUS)/1e6
		overlaps := false
		for _, br := range bursts {
			if br.CompletionMS > 0 && c.SendS < br.FireS+br.CompletionMS/1000 && endS > br.FireS {
				overlaps = true
				break
			}
		}
		if overlaps {
			in = append(in, c.LatencyUS)
		} else {
			quiet = append(quiet, c.LatencyUS)
		}
	}
	r := BackgroundResult{Summary: Summarize(all, errs.N, 0), Quiet: Summarize(quiet, 0, 0), InBurst: Summarize(in, 0, 0),
		Errors: errs.Messages, Calls: calls}
	if s := startsOf(res); !(len(s) == 1 && s["unknown"] > 0) {
		r.Starts = s
	}
	return r
}

// finish summarizes each phase's bursts and sets the ratios of torpor's
// phases to the baseline's.
func (r *BurstsReport) finish() {
	var base *BurstsPhase
	for _, ph := range r.Phases {
		var lat []int64
		var done []float64
		failures := 0
		for _, br := range ph.Bursts {
			failures += br.Failures
			for _, c := range br.Calls {
				if c.OK {
					lat = append(lat, c.LatencyUS)
				}
			}
			if br.CompletionMS > 0 {
				done = append(done, br.CompletionMS)
			}
		}
		ph.AllBursts = Summarize(lat, failures, 0)
		ph.CompletionP50MS = median(done)
		if len(done) > 0 {
			ph.CompletionMaxMS = slices.Max(done)
		}
		if ph.System == SeriesFork {
			base = ph
		}
	}
	if base == nil {
		return
	}
	for _, ph := range r.Phases {
		if ph == base {
			continue
		}
		ph.RatioBurstP50 = Ratio(ph.AllBursts.P50US, base.AllBursts.P50US)
		ph.RatioBurstP99 = Ratio(ph.AllBursts.P99US, base.AllBursts.P99US)
		ph.RatioCompletion = ratioF(ph.CompletionP50MS, base.CompletionP50MS)
		ph.RatioBackgroundP99 = Ratio(ph.Background.P99US, base.Background.P99US)
	}
}

// sleepUntil waits until t or until ctx is cancelled (its error).
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
