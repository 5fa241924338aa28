package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/function"
)

// Part overhead (R-Check §5.6.2, Fig 5.7): the cost of evictions to a
// workload of Calls calls whose durations follow R-Check's Table 5.3 (an
// Azure Functions trace), for eviction rates of 1-20 % of the calls, under
// three policies measured in the same run on real clusters:
//
//   - torpor (R-Check): an evicted worker checkpoints the running call
//     and another worker resumes it;
//   - re-run: the evicted worker abandons it (--eviction-grace 0) and
//     the call runs again from the start elsewhere;
//   - Kappa-style: the function checkpoints its own state every 25 s
//     (application level, through a coordinator, to the same store);
//     evictions abandon the call as for re-run, and the new run carries
//     on from the last saved state.
//
// Every number is measured. All Calls calls run once uninterrupted (the
// plain function, and the Kappa-style one, which pays its checkpoints
// on every call): their sum is the workload's total time. Then the calls
// an eviction hits — Rates' largest fraction of them, drawn at random —
// run again one at a time under each policy, each twice in a row: alone
// and uninterrupted (the control), then on a worker that gets SIGTERM at
// a random instant of the call. The eviction's cost to that call is the
// difference of the two: the pair shares the cluster's state (a hot
// instance, no other load), so neither cold starts nor the concurrency of
// the full run leak into it. The victims of a lower rate are a prefix of
// those of a higher one, so each hit call is measured once per policy.
// A policy's overhead at rate r is the sum of its hit calls' costs (for
// Kappa-style, plus its checkpoints on every call) over the plain
// workload's total time.
//
// Time scale: the trace's durations (2 s to 143 s), the Kappa period
// (25 s) and the eviction grace (30 s) are multiplied by TimeScale
// (default 1: full length). A smaller scale shortens the run, but what a
// move costs (checkpoint, restore) is not scaled while the work a re-run
// loses is: at 0.05 a 2 s call lasts 100 ms, less than its checkpoint and
// restore, and re-running wins. Compare policies at full length.

// evictClass is one row of R-Check's Table 5.3: BFS on an input of MB
// megabytes runs Seconds, and Percent of the calls are of this row.
type evictClass struct {
	MB      int     `json:"mb"`
	Seconds float64 `json:"seconds"`
	Percent float64 `json:"percent"`
}

// evictMix is R-Check's Table 5.3.
var evictMix = []evictClass{
	{1, 2, 95.6}, {5, 12, 3.5}, {10, 21, 0.2}, {15, 54, 0.32}, {20, 89, 0.33}, {25, 112, 0.02}, {30, 143, 0.03},
}

// Timeline constants of R-Check's evaluation, before TimeScale.
const (
	kappaPeriod   = 25 * time.Second // R-Check's choice for Kappa: checkpoint 5 s before a 30 s grace
	rcheckGrace   = 30 * time.Second // the spot-eviction grace R-Check assumes
	overheadStep  = 10 * time.Millisecond
	evictPollStep = 5 * time.Millisecond
)

// Policies of the overhead part.
const (
	PolicyRCheck = "torpor"
	PolicyRerun  = "rerun"
	PolicyKappa  = "kappa"
)

// overheadPolicies are the policies, in the order they run.
var overheadPolicies = []string{PolicyRCheck, PolicyRerun, PolicyKappa}

// workloadCode is the overhead part's function: a stand-in for R-Check's
// BFS, it holds mb MB of state (random bytes, seeded by the call: as
// incompressible as a graph, and the same in every run of the call) and
// runs steps steps of step_ms, each dirtying a page of the state and
// folding it into a checksum. With "kappa" set it is Kappa-style: it
// starts from the state last saved under its key, if any, and saves its
// state every period_s.
const workloadCode = `import pickle, random, time, urllib.error, urllib.request
def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
def _put(url, body):
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=60).read()
def handler(e, c):
    k = e.get("kappa")
    st, resumed, saves = None, False, 0
    if k:
        blob = _get(k["url"])
        if blob is not None:
            st, resumed = pickle.loads(blob), True
    if st is None:
        st = {"step": 0, "acc": 0, "buf": bytearray(random.Random(e["i"]).randbytes(e["mb"] << 20))}
    buf, pages = st["buf"], len(st["buf"]) // 4096
    last = time.monotonic()
    while st["step"] < e["steps"]:
        i = st["step"]
        p = (i * 7919 % pages) * 4096
        buf[p] = (buf[p] + i) & 255
        st["acc"] = (st["acc"] * 31 + buf[p] + i) & 0xFFFFFFFF
        time.sleep(e["step_ms"] / 1000)
        st["step"] = i + 1
        if k and time.monotonic() - last >= k["period_s"] and st["step"] < e["steps"]:
            _put(k["url"], pickle.dumps(st, protocol=5))
            saves += 1
            last = time.monotonic()
    return {"i": e["i"], "steps": st["step"], "acc": st["acc"], "resumed": resumed, "saves": saves}
`

// workloadResult is workloadCode's answer.
type workloadResult struct {
	I       int    `json:"i"`
	Steps   int    `json:"steps"`
	Acc     uint32 `json:"acc"`
	Resumed bool   `json:"resumed"`
	Saves   int    `json:"saves"`
}

// overheadCall is one call of the workload.
type overheadCall struct {
	I     int     `json:"i"`
	Class int     `json:"class"` // index in Classes
	MB    int     `json:"mb"`
	Steps int     `json:"steps"`
	At    float64 `json:"evict_at"` // fraction of its duration at which an eviction hits it, if it is a victim
}

// EvictOverheadRun is the overhead part's outcome.
type EvictOverheadRun struct {
	Calls        int          `json:"calls"`
	Concurrency  int          `json:"concurrency"` // of the uninterrupted runs
	TimeScale    float64      `json:"time_scale"`
	Seed         uint64       `json:"seed"`
	StepMS       float64      `json:"step_ms"`
	GraceMS      int64        `json:"grace_ms"`       // torpor's eviction grace (scaled)
	KappaPeriodS float64      `json:"kappa_period_s"` // scaled
	Classes      []evictClass `json:"classes"`        // R-Check Table 5.3
	ClassCounts  []int        `json:"class_counts"`   // calls drawn of each
	Rates        []float64    `json:"rates"`          // percent
	Victims      []int        `json:"victims"`        // call indexes, in order: rate r hits the first round(r·Calls/100)

	Plain OverheadFull `json:"plain"` // the plain function, uninterrupted
	Kappa OverheadFull `json:"kappa"` // the Kappa-style function, uninterrupted
	// Hits[policy][k] is the k-th victim's call under that policy.
	Hits map[string][]OverheadHit `json:"hits"`
	// Overhead[policy][j] is the overhead at Rates[j], a fraction.
	Overhead map[string][]float64 `json:"overhead"`
	// KappaNoEviction is the Kappa-style function's overhead without any
	// eviction: the price of its checkpoints.
	KappaNoEviction float64 `json:"kappa_no_eviction"`

	Failures int      `json:"failures"`
	Errors   []string `json:"errors,omitempty"`
}

// OverheadFull is one uninterrupted run of every call.
type OverheadFull struct {
	LatencyMS []float64 `json:"latency_ms"` // by call index
	Saves     []int     `json:"saves,omitempty"`
	TotalS    float64   `json:"total_s"` // sum of the latencies
	ElapsedS  float64   `json:"elapsed_s"`
}

// OverheadHit is one victim under one policy.
type OverheadHit struct {
	I         int     `json:"i"`
	LatencyMS float64 `json:"latency_ms"`
	// ControlMS is the same call's latency alone and uninterrupted, just
	// before: LatencyMS - ControlMS is what the eviction cost it.
	ControlMS float64 `json:"control_ms"`
	EvictMS   float64 `json:"evict_ms"` // SIGTERM, after the call was sent
	Worker    string  `json:"worker"`   // the evicted one
	// From the call's record and result.
	Moved        bool    `json:"moved"`  // it left as a checkpoint
	Lost         bool    `json:"lost"`   // it ran again from the start (or from Kappa's last save)
	Missed       bool    `json:"missed"` // it ended before the eviction struck
	CheckpointMS float64 `json:"checkpoint_ms,omitempty"`
	RestoreMS    float64 `json:"restore_ms,omitempty"`
	ImageBytes   int64   `json:"image_bytes,omitempty"`
	Resumed      bool    `json:"resumed_from_save,omitempty"` // Kappa: the re-run started from a saved state
	Error        string  `json:"error,omitempty"`
}

const (
	evictWorkFunction  = "bench-evict-work"
	evictKappaFunction = "bench-evict-kappa"
)

// drawWorkload draws opts.Calls calls from the mix, and the victims.
func drawWorkload(opts EvictOptions) ([]overheadCall, []int, []int) {
	rng := rand.New(rand.NewPCG(opts.Seed, 3))
	counts := make([]int, len(evictMix))
	calls := make([]overheadCall, opts.Calls)
	var total float64
	for _, c := range evictMix {
		total += c.Percent
	}
	step := opts.TimeScale * float64(time.Second) / float64(overheadStep)
	for i := range calls {
		x, k := rng.Float64()*total, 0
		for ; k < len(evictMix)-1 && x >= evictMix[k].Percent; k++ {
			x -= evictMix[k].Percent
		}
		counts[k]++
		// An eviction strikes within the first 95 %: later, it races the
		// call's end.
		calls[i] = overheadCall{I: i, Class: k, MB: evictMix[k].MB, Steps: max(1, int(math.Round(evictMix[k].Seconds*step))),
			At: 0.95 * rng.Float64()}
	}
	n := int(math.Round(slicesMax(opts.Rates) * float64(opts.Calls) / 100))
	victims := rng.Perm(opts.Calls)[:n]
	return calls, counts, victims
}

func slicesMax(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

func evictOverhead(ctx context.Context, opts EvictOptions, env *evictEnv, out io.Writer) (*EvictOverheadRun, error) {
	calls, counts, victims := drawWorkload(opts)
	grace := time.Duration(float64(rcheckGrace) * opts.TimeScale)
	period := time.Duration(float64(kappaPeriod) * opts.TimeScale).Seconds()
	run := &EvictOverheadRun{Calls: opts.Calls, Concurrency: opts.Concurrency, TimeScale: opts.TimeScale, Seed: opts.Seed,
		StepMS: float64(overheadStep) / 1e6, GraceMS: grace.Milliseconds(), KappaPeriodS: period, Classes: evictMix,
		ClassCounts: counts, Rates: opts.Rates, Victims: victims, Hits: map[string][]OverheadHit{}, Overhead: map[string][]float64{}}
	fmt.Fprintf(out, "\n== part overhead: %d calls (R-Check Table 5.3 durations x %g), %d victims (%g%%); grace %s, Kappa period %.2f s\n",
		opts.Calls, opts.TimeScale, len(victims), slicesMax(opts.Rates), grace, period)
	relay, err := startKappaRelay(env.state)
	if err != nil {
		return nil, err
	}
	defer relay.close()
	event := func(c overheadCall, kappaKey string) []byte {
		m := map[string]any{"i": c.I, "mb": c.MB, "steps": c.Steps, "step_ms": float64(overheadStep) / 1e6}
		if kappaKey != "" {
			m["kappa"] = map[string]any{"url": relay.stateURL(kappaKey), "period_s": period}
		}
		b, _ := json.Marshal(m)
		return b
	}
	// The longest call, with its moves, stays well inside the timeout; a
	// timeout past the grace makes the instances checkpointable.
	timeout := max(5*evictMix[len(evictMix)-1].Seconds*opts.TimeScale+60, grace.Seconds()+60)
	// want[i] is call i's answer in the plain run; concurrent calls write
	// their own index only.
	want := make([]workloadResult, len(calls))
	for _, policy := range overheadPolicies {
		pgrace, fn, kappa := grace, evictWorkFunction, false
		switch policy {
		case PolicyRerun:
			pgrace = 0
		case PolicyKappa:
			pgrace, fn, kappa = 0, evictKappaFunction, true
		}
		part := EvictPartOverhead + "-" + policy
		c, cli, err := evictCluster(ctx, opts, env, part, pgrace)
		if err != nil {
			return run, err
		}
		err = func() error {
			defer closeEvictCluster(c, opts, part)
			mem := memoryFor(evictMix[len(evictMix)-1].MB * 3) // the state, its pickle and a copy in flight
			if err := deployEvict(ctx, cli, function.Spec{Name: fn, MemoryMB: mem, TimeoutSec: timeout}, workloadCode); err != nil {
				return err
			}
			key := func(c overheadCall, round string) string {
				if !kappa {
					return ""
				}
				return fmt.Sprintf("%s-%d-%d", round, c.I, time.Now().UnixNano())
			}
			if policy != PolicyRerun { // re-run's uninterrupted calls are the plain ones
				full, err := overheadFull(ctx, cli, fn, calls, opts.Concurrency, func(c overheadCall) []byte { return event(c, key(c, "full")) },
					func(c overheadCall, r workloadResult) error {
						if !kappa {
							want[c.I] = r
							return nil
						}
						return r.check(want[c.I])
					})
				if err != nil {
					return err
				}
				if kappa {
					run.Kappa = *full
				} else {
					run.Plain = *full
				}
				fmt.Fprintf(out, "%-7s uninterrupted: %d calls, sum of latencies %.1f s, %.0f s elapsed\n", policy, len(calls), full.TotalS, full.ElapsedS)
			}
			// Fresh workers: an evicted worker lets a call finish when its
			// function's past calls (5 or more, on that worker) predict
			// it ends within the grace. The hits measure what moving a
			// call costs (R-Check's mechanism), so they run on workers
			// that have not seen that many: a hit call let finish shows
			// in the table as not moved.
			for _, w := range c.Workers() {
				if err := stopWorker(ctx, c, w); err != nil {
					return err
				}
				if err := c.Restart(ctx, w); err != nil {
					return err
				}
			}
			// A hot instance for the first hit, as every later one finds.
			if _, err := cli.Invoke(ctx, fn, 0, event(overheadCall{I: -1, MB: 1, Steps: 1}, "")); err != nil {
				return fmt.Errorf("warm-up call: %w", err)
			}
			hits, err := overheadHits(ctx, c, cli, fn, calls, victims, func(c overheadCall) []byte { return event(c, key(c, "hit")) },
				want, out, policy)
			run.Hits[policy] = hits
			return err
		}()
		if err != nil {
			return run, fmt.Errorf("%s: %w", policy, err)
		}
	}
	for _, p := range overheadPolicies {
		for _, h := range run.Hits[p] {
			if h.Error != "" {
				run.Failures++
				run.Errors = append(run.Errors, fmt.Sprintf("%s call %d: %s", p, h.I, h.Error))
			}
		}
	}
	run.summarize()
	return run, nil
}

func (r workloadResult) check(want workloadResult) error {
	if r.I != want.I || r.Steps != want.Steps || r.Acc != want.Acc {
		return fmt.Errorf("result %+v, want call %d, %d steps, checksum %d (the uninterrupted run's)", r, want.I, want.Steps, want.Acc)
	}
	return nil
}

// overheadFull runs every call once, conc at a time, and checks each answer.
func overheadFull(ctx context.Context, cli *client.Client, fn string, calls []overheadCall, conc int,
	event func(overheadCall) []byte, check func(overheadCall, workloadResult) error) (*OverheadFull, error) {
	full := &OverheadFull{LatencyMS: make([]float64, len(calls)), Saves: make([]int, len(calls))}
	errs := make([]error, len(calls))
	next := make(chan int)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := range next {
				c := calls[i]
				ts := time.Now()
				res, err := cli.Invoke(ctx, fn, 0, event(c))
				full.LatencyMS[i] = msSince(ts)
				var r workloadResult
				if err == nil {
					r, err = parseWorkload(res)
				}
				if err == nil {
					full.Saves[i] = r.Saves
					err = check(c, r)
				}
				errs[i] = err
			}
		})
	}
	for i := range calls {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	full.ElapsedS = time.Since(t0).Seconds()
	for i, err := range errs {
		if err != nil {
			return full, fmt.Errorf("uninterrupted call %d: %w", i, err)
		}
		full.TotalS += full.LatencyMS[i] / 1000
	}
	return full, nil
}

func parseWorkload(res *client.Result) (workloadResult, error) {
	var r workloadResult
	if res.FunctionError != nil {
		return r, fmt.Errorf("function error: %s", res.FunctionError)
	}
	if err := json.Unmarshal(res.Payload, &r); err != nil {
		return r, fmt.Errorf("result %.200q: %w", res.Payload, err)
	}
	return r, nil
}

// overheadHits runs each victim alone: sent to the cluster, its worker
// gets SIGTERM at its instant and is started again once it exited.
func overheadHits(ctx context.Context, c *Cluster, cli *client.Client, fn string, calls []overheadCall, victims []int,
	event func(overheadCall) []byte, want []workloadResult, out io.Writer, policy string) ([]OverheadHit, error) {
	hits := make([]OverheadHit, 0, len(victims))
	t0 := time.Now()
	for k, i := range victims {
		h, err := overheadHit(ctx, c, cli, fn, calls[i], event, want[i])
		hits = append(hits, h)
		if err != nil {
			return hits, fmt.Errorf("victim %d (call %d): %w", k, i, err)
		}
		if k%50 == 49 || k == len(victims)-1 {
			fmt.Fprintf(out, "%-7s %d/%d victims, %.0f s\n", policy, k+1, len(victims), time.Since(t0).Seconds())
		}
	}
	return hits, nil
}

// invokeOutcome is a call's answer and its client-side latency.
type invokeOutcome struct {
	res *client.Result
	err error
	ms  float64
}

// overheadHit measures one victim: the call runs and, once a worker is
// seen running it, that worker gets SIGTERM at the call's instant (At of
// its duration); the worker is started again once it exited. Then the
// same call runs again, uninterrupted: the control. Both find a hot
// instance (the one the previous call left), so the difference is what
// the eviction cost.
func overheadHit(ctx context.Context, c *Cluster, cli *client.Client, fn string, call overheadCall,
	event func(overheadCall) []byte, want workloadResult) (OverheadHit, error) {
	h := OverheadHit{I: call.I}
	done := make(chan invokeOutcome, 1)
	ts := time.Now()
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		res, err := cli.Invoke(cctx, fn, 0, event(call))
		done <- invokeOutcome{res, err, msSince(ts)}
	}()
	victim, o, err := findRunning(ctx, c, cli, done)
	if err != nil {
		<-done
		return h, err
	}
	if o == nil {
		dur := time.Duration(float64(call.Steps) * float64(overheadStep))
		time.Sleep(time.Duration(call.At * float64(dur)))
		h.EvictMS, h.Worker = msSince(ts), victim
		if err := c.Signal(victim, syscall.SIGTERM); err != nil {
			<-done
			return h, err
		}
		x := <-done
		o = &x
		if err := c.Wait(ctx, victim); err != nil {
			return h, fmt.Errorf("evicted worker %s: %w", victim, err)
		}
	}
	h.LatencyMS = o.ms
	if o.err != nil {
		h.Error = o.err.Error()
	} else if r, err := parseWorkload(o.res); err != nil {
		h.Error = err.Error()
	} else if err := r.check(want); err != nil {
		h.Error = err.Error()
	} else {
		h.Resumed = r.Resumed
	}
	if o.res != nil && o.res.CallID != "" {
		if rec, err := finalRecord(ctx, cli, o.res.CallID); err == nil {
			hs := hops(rec)
			h.Moved, h.Lost = hs.Evicted > 0, hs.Lost > 0
			if len(hs.CheckpointMS) > 0 {
				h.CheckpointMS, h.ImageBytes = hs.CheckpointMS[0], hs.ImageBytes[0]
			}
			if len(hs.RestoreMS) > 0 {
				h.RestoreMS = hs.RestoreMS[0]
			}
		}
	}
	// Not struck: it ended before the eviction, or was let finish.
	h.Missed = !h.Moved && !h.Lost
	if victim != "" {
		if err := c.Restart(ctx, victim); err != nil {
			return h, err
		}
	}
	t0 := time.Now()
	res, err := cli.Invoke(ctx, fn, 0, event(call))
	h.ControlMS = msSince(t0)
	if err == nil {
		var r workloadResult
		if r, err = parseWorkload(res); err == nil {
			err = r.check(want)
		}
	}
	if err != nil && h.Error == "" {
		h.Error = "control run: " + err.Error()
	}
	return h, nil
}

// stopWorker stops worker id (SIGTERM: it runs nothing to move) and
// waits for it to exit.
func stopWorker(ctx context.Context, c *Cluster, id string) error {
	if err := c.Signal(id, syscall.SIGTERM); err != nil {
		return err
	}
	if err := c.Wait(ctx, id); err != nil {
		return fmt.Errorf("stop worker %s: %w", id, err)
	}
	return nil
}

// findRunning polls the workers until one runs a call, and names it; o is
// the call's outcome when it ended first.
func findRunning(ctx context.Context, c *Cluster, cli *client.Client, done <-chan invokeOutcome) (string, *invokeOutcome, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case o := <-done:
			return "", &o, nil
		default:
		}
		for _, id := range c.Workers() {
			if w, err := cli.Worker(ctx, id); err == nil && w.Running > 0 {
				return id, nil, nil
			}
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("the call was not seen running on any worker within 30 s")
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(evictPollStep):
		}
	}
}
