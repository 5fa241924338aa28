package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/function"
)

// Part concurrency (R-Check §5.7): N sync calls run on worker A; a fresh
// worker B joins, A gets SIGTERM and moves them all; every call must
// return its normal result. Its records give each call's checkpoint and
// restore time.

// EvictConcurrencyRun is the concurrency part's outcome.
type EvictConcurrencyRun struct {
	MB          int     `json:"mb"`
	CallSeconds float64 `json:"call_seconds"`
	GraceMS     int64   `json:"grace_ms"`
	TimeoutS    float64 `json:"timeout_s"`
	// BaselineMS is the latency of one uninterrupted call, measured first.
	BaselineMS float64            `json:"baseline_ms"`
	Steps      []EvictConcurrency `json:"steps"`
}

// EvictConcurrency is one N of the concurrency part.
type EvictConcurrency struct {
	N        int    `json:"n"`
	From     string `json:"from"` // the evicted worker
	To       string `json:"to"`   // the fresh one
	Moved    int    `json:"moved"`
	Failures int    `json:"failures"`
	// EvictionMS is from SIGTERM to the evicted worker's exit.
	EvictionMS float64 `json:"eviction_ms"`
	// Per call, in call order (0 when the call did not move).
	CheckpointMS []float64 `json:"checkpoint_ms"`
	RestoreMS    []float64 `json:"restore_ms"`
	ImageBytes   []int64   `json:"image_bytes"`
	LatencyMS    []float64 `json:"latency_ms"` // client-side, of the sync call
	CallIDs      []string  `json:"call_ids"`
	Errors       []string  `json:"errors,omitempty"`
	// Summaries over the moved calls.
	CheckpointP50 float64 `json:"checkpoint_p50_ms"`
	CheckpointP95 float64 `json:"checkpoint_p95_ms"`
	RestoreP50    float64 `json:"restore_p50_ms"`
	RestoreP95    float64 `json:"restore_p95_ms"`
	LatencyP50    float64 `json:"latency_p50_ms"`
}

const evictMemFunction = "bench-evict-mem"

func evictConcurrency(ctx context.Context, opts EvictOptions, env *evictEnv, out io.Writer) (*EvictConcurrencyRun, error) {
	fmt.Fprintf(out, "\n== part concurrency: N sync calls (%d MB of random bytes each, ~%gs) moved from a SIGTERMed worker to a fresh one; grace %s\n",
		opts.MB, opts.CallSeconds, opts.Grace)
	c, cli, err := evictCluster(ctx, opts, env, EvictPartConcurrency, opts.Grace)
	if err != nil {
		return nil, err
	}
	defer closeEvictCluster(c, opts, EvictPartConcurrency)
	// The timeout is past the grace, so the calls run on checkpointable
	// instances, and past any call's run time with its moves.
	timeout := max(opts.Grace.Seconds()+60, 5*opts.CallSeconds, 300)
	run := &EvictConcurrencyRun{MB: opts.MB, CallSeconds: opts.CallSeconds, GraceMS: opts.Grace.Milliseconds(), TimeoutS: timeout}
	spec := function.Spec{Name: evictMemFunction, MemoryMB: memoryFor(opts.MB), TimeoutSec: timeout}
	if err := deployEvict(ctx, cli, spec, memCode); err != nil {
		return nil, err
	}
	const stepMS = 100
	steps := int(opts.CallSeconds * 1000 / stepMS)
	event := func(i int) []byte {
		b, _ := json.Marshal(map[string]any{"mb": opts.MB, "steps": steps, "step_ms": stepMS, "i": i})
		return b
	}
	a, b := c.Workers()[0], c.Workers()[1]
	// Only A runs calls: B is stopped until its calls are running.
	if err := stopWorker(ctx, c, b); err != nil {
		return nil, err
	}
	// The baseline: one uninterrupted call (also the first, cold, call).
	t0 := time.Now()
	res, err := cli.Invoke(ctx, evictMemFunction, 0, event(-1))
	if err == nil {
		err = checkMem(res, -1, steps, opts.MB)
	}
	if err != nil {
		return nil, fmt.Errorf("uninterrupted call: %w", err)
	}
	run.BaselineMS = msSince(t0)
	fmt.Fprintf(out, "uninterrupted call: %.0f ms\n", run.BaselineMS)

	for _, n := range opts.N {
		// A fresh version for each step, deployed while only A runs (its
		// instance starts there): an evicted worker lets a call finish
		// when 5 or more finished calls of its version predict it ends
		// within the grace, and this part measures calls that move.
		if err := deployEvict(ctx, cli, spec, memCode); err != nil {
			return run, err
		}
		step, err := evictConcurrencyStep(ctx, c, cli, a, b, n, event, steps, opts)
		if step != nil {
			run.Steps = append(run.Steps, *step)
			fmt.Fprintf(out, "N=%-2d %s -> %s: moved %d/%d, failed %d, checkpoint p50 %.0f ms, restore p50 %.0f ms, eviction %.0f ms\n",
				n, a, b, step.Moved, n, step.Failures, step.CheckpointP50, step.RestoreP50, step.EvictionMS)
		}
		if err != nil {
			return run, fmt.Errorf("N=%d: %w (logs: %s, %s)", n, err, c.LogFile(a), c.LogFile(b))
		}
		a, b = b, a
	}
	return run, nil
}

func evictConcurrencyStep(ctx context.Context, c *Cluster, cli *client.Client, a, b string, n int,
	event func(int) []byte, steps int, opts EvictOptions) (*EvictConcurrency, error) {
	st := &EvictConcurrency{N: n, From: a, To: b, CheckpointMS: make([]float64, n), RestoreMS: make([]float64, n),
		ImageBytes: make([]int64, n), LatencyMS: make([]float64, n), CallIDs: make([]string, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			t0 := time.Now()
			res, err := cli.Invoke(ctx, evictMemFunction, 0, event(i))
			st.LatencyMS[i] = msSince(t0)
			if res != nil {
				st.CallIDs[i] = res.CallID
			}
			if err == nil {
				err = checkMem(res, i, steps, opts.MB)
			}
			errs[i] = err
		})
	}
	// All N run on A before B joins and A is told to go.
	if err := waitRunning(ctx, cli, a, n, time.Duration(opts.CallSeconds*float64(time.Second))/2+30*time.Second); err != nil {
		wg.Wait()
		return nil, err
	}
	if err := c.Restart(ctx, b); err != nil {
		wg.Wait()
		return nil, err
	}
	if err := waitRunning(ctx, cli, a, n, time.Second); err != nil {
		wg.Wait()
		return nil, fmt.Errorf("the calls ended before the eviction (start %s sooner, or raise --call-seconds): %w", b, err)
	}
	t0 := time.Now()
	if err := c.Signal(a, syscall.SIGTERM); err != nil {
		wg.Wait()
		return nil, err
	}
	werr := c.Wait(ctx, a)
	st.EvictionMS = msSince(t0)
	wg.Wait()
	if werr != nil {
		return st, fmt.Errorf("evicted worker %s exited with %v", a, werr)
	}
	var cks, rss []float64
	for i := range n {
		if errs[i] == nil && st.CallIDs[i] != "" {
			rec, err := finalRecord(ctx, cli, st.CallIDs[i])
			if err != nil {
				errs[i] = fmt.Errorf("record: %w", err)
			} else if h := hops(rec); h.Evicted > 0 && h.Resumes > 0 {
				st.Moved++
				st.CheckpointMS[i], st.RestoreMS[i], st.ImageBytes[i] = h.CheckpointMS[0], h.RestoreMS[0], h.ImageBytes[0]
				cks, rss = append(cks, h.CheckpointMS[0]), append(rss, h.RestoreMS[0])
			}
		}
		if errs[i] != nil {
			st.Failures++
			st.Errors = append(st.Errors, fmt.Sprintf("call %d (%s): %v", i, st.CallIDs[i], errs[i]))
		}
	}
	st.CheckpointP50, st.CheckpointP95 = floatPercentile(cks, 50), floatPercentile(cks, 95)
	st.RestoreP50, st.RestoreP95 = floatPercentile(rss, 50), floatPercentile(rss, 95)
	st.LatencyP50 = floatPercentile(st.LatencyMS, 50)
	return st, nil
}

// checkMem checks a memCode answer.
func checkMem(res *client.Result, i, steps, mb int) error {
	if res.FunctionError != nil {
		return fmt.Errorf("function error: %s", res.FunctionError)
	}
	var r memResult
	if err := json.Unmarshal(res.Payload, &r); err != nil {
		return fmt.Errorf("result %.200q: %w", res.Payload, err)
	}
	return r.check(i, steps, mb)
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
