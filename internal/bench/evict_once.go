package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/counter"
	"github.com/torpor-dev/torpor/internal/function"
)

// Part exactly-once: batches of concurrent sync calls of a function with
// non-deterministic work and external side effects (counter.DrawsCode, as
// in internal/app's exactly-once test: random draws, increments of a
// counter over HTTP at random steps) run on one worker, which gets SIGTERM at a random instant; every call
// must return the result, and leave the counts, of exactly one
// uninterrupted run.

const (
	evictOnceFunction = "bench-evict-once"
	onceSteps         = 40
	onceStepMS        = 25
	onceGrace         = 20 * time.Second
)

// EvictOnceRun is the exactly-once part's outcome.
type EvictOnceRun struct {
	Trials     int             `json:"trials"`
	Batch      int             `json:"batch"`
	Steps      int             `json:"steps"`
	StepMS     int             `json:"step_ms"`
	CallMS     float64         `json:"call_ms"` // an uninterrupted call, the longest of 3
	Moved      int             `json:"moved"`   // calls with a checkpointed attempt
	OnEvicted  int             `json:"on_evicted"`
	Mismatches int             `json:"mismatches"` // wrong result or count
	Failures   int             `json:"failures"`   // calls that returned an error
	Lost       int             `json:"lost"`       // attempts lost (none expected with SIGTERM)
	ElapsedS   float64         `json:"elapsed_s"`
	Calls      []EvictOnceCall `json:"calls"`
}

// EvictOnceCall is one trial.
type EvictOnceCall struct {
	Trial     int     `json:"trial"`
	Batch     int     `json:"batch"`
	CallID    string  `json:"call_id"`
	Key       string  `json:"key"`
	OffsetMS  float64 `json:"offset_ms"` // its start after the batch's
	EvictMS   float64 `json:"evict_ms"`  // the SIGTERM after the batch's start
	Evicted   string  `json:"evicted"`   // the worker that got it
	Worker    string  `json:"worker"`    // of the first attempt
	Moved     bool    `json:"moved"`
	Attempts  int     `json:"attempts"`
	LatencyMS float64 `json:"latency_ms"`
	Error     string  `json:"error,omitempty"`
}

func evictOnce(ctx context.Context, opts EvictOptions, env *evictEnv, out io.Writer) (*EvictOnceRun, error) {
	fmt.Fprintf(out, "\n== part exactly-once: %d trials, batches of %d concurrent calls, SIGTERM at a random instant\n", opts.Trials, opts.Batch)
	ctr, err := counter.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ctr.Close()
	c, cli, err := evictCluster(ctx, opts, env, EvictPartOnce, onceGrace)
	if err != nil {
		return nil, err
	}
	defer closeEvictCluster(c, opts, EvictPartOnce)
	spec := function.Spec{Name: evictOnceFunction, MemoryMB: 128, TimeoutSec: 120}
	if err := deployEvict(ctx, cli, spec, counter.DrawsCode); err != nil {
		return nil, err
	}
	run := &EvictOnceRun{Trials: opts.Trials, Batch: opts.Batch, Steps: onceSteps, StepMS: onceStepMS}
	event := func(key string) []byte { return counter.DrawsEvent(ctr.URL(), key, onceSteps, onceStepMS) }
	a, b := c.Workers()[0], c.Workers()[1]
	if err := stopWorker(ctx, c, b); err != nil {
		return nil, err
	}
	// Uninterrupted calls: the check's reference and the call's duration.
	var dur time.Duration
	for i := range 3 {
		key := "plain-" + strconv.Itoa(i)
		t0 := time.Now()
		res, err := cli.Invoke(ctx, evictOnceFunction, 0, event(key))
		dur = max(dur, time.Since(t0))
		if err == nil {
			err = onceCheckResult(res, ctr.Value(key))
		}
		if err != nil {
			return nil, fmt.Errorf("uninterrupted call: %w", err)
		}
	}
	run.CallMS = float64(dur.Microseconds()) / 1000
	fmt.Fprintf(out, "uninterrupted call: %.0f ms (%d steps of %d ms, increments over HTTP)\n", run.CallMS, onceSteps, onceStepMS)

	rng := rand.New(rand.NewPCG(opts.Seed, 2))
	start := time.Now()
	for batch, trial := 0, 0; trial < opts.Trials; batch++ {
		k := min(opts.Batch, opts.Trials-trial)
		// A fresh version for each batch, deployed while only A runs: an
		// evicted worker lets a call finish when 5 or more finished calls
		// of its version predict it ends within the grace, and the proof
		// wants calls that move.
		if err := deployEvict(ctx, cli, spec, counter.DrawsCode); err != nil {
			return run, err
		}
		calls, err := onceBatch(ctx, c, cli, ctr, rng, a, b, batch, trial, k, dur, event)
		run.Calls = append(run.Calls, calls...)
		for _, cl := range calls {
			if cl.Moved {
				run.Moved++
			}
			if cl.Worker == a {
				run.OnEvicted++
			}
			if cl.Error != "" {
				if cl.CallID == "" || cl.Attempts == 0 {
					run.Failures++
				} else {
					run.Mismatches++
				}
				fmt.Fprintf(out, "MISMATCH trial %d (batch %d, call %s, key %s, started +%.0f ms, SIGTERM to %s at +%.0f ms, moved %t, %d attempts): %s\n",
					cl.Trial, cl.Batch, cl.CallID, cl.Key, cl.OffsetMS, cl.Evicted, cl.EvictMS, cl.Moved, cl.Attempts, cl.Error)
			}
		}
		if err != nil {
			run.ElapsedS = time.Since(start).Seconds()
			return run, fmt.Errorf("batch %d: %w (logs: %s, %s)", batch, err, c.LogFile(a), c.LogFile(b))
		}
		trial += k
		if batch%10 == 9 || trial == opts.Trials {
			fmt.Fprintf(out, "%d/%d trials, %d moved, %d mismatches, %d failed, %.0f s\n",
				trial, opts.Trials, run.Moved, run.Mismatches, run.Failures, time.Since(start).Seconds())
		}
		a, b = b, a
	}
	run.ElapsedS = time.Since(start).Seconds()
	return run, nil
}

// onceBatch runs k trials: B (stopped) is restarted, k calls start on A at
// random offsets within one call duration, and A gets SIGTERM at a random
// instant within two.
func onceBatch(ctx context.Context, c *Cluster, cli *client.Client, ctr *counter.Server, rng *rand.Rand,
	a, b string, batch, trial, k int, dur time.Duration, event func(string) []byte) ([]EvictOnceCall, error) {
	if err := c.Restart(ctx, b); err != nil {
		return nil, err
	}
	calls := make([]EvictOnceCall, k)
	evictAt := time.Duration(rng.Int64N(int64(2 * dur)))
	for i := range calls {
		calls[i] = EvictOnceCall{Trial: trial + i, Batch: batch, Key: fmt.Sprintf("t%d-%d", trial+i, time.Now().UnixNano()),
			OffsetMS: float64(rng.Int64N(int64(dur))) / 1e6, EvictMS: float64(evictAt) / 1e6, Evicted: a}
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range calls {
		cl := &calls[i]
		wg.Go(func() {
			time.Sleep(time.Until(t0.Add(time.Duration(cl.OffsetMS * 1e6))))
			ts := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			res, err := cli.Invoke(cctx, evictOnceFunction, 0, event(cl.Key))
			cl.LatencyMS = msSince(ts)
			if res != nil {
				cl.CallID = res.CallID
			}
			if err == nil {
				err = onceCheckResult(res, ctr.Value(cl.Key))
			}
			if err != nil {
				cl.Error = err.Error()
			}
		})
	}
	time.Sleep(time.Until(t0.Add(evictAt)))
	if err := c.Signal(a, syscall.SIGTERM); err != nil {
		wg.Wait()
		return calls, err
	}
	wg.Wait()
	werr := c.Wait(ctx, a)
	for i := range calls {
		cl := &calls[i]
		if cl.CallID == "" {
			continue
		}
		rec, err := finalRecord(ctx, cli, cl.CallID)
		if err != nil {
			cl.Error += "; record: " + err.Error()
			continue
		}
		h := hops(rec)
		cl.Moved, cl.Attempts = h.Checkpoints > 0, len(rec.Attempts)
		if len(rec.Attempts) > 0 {
			cl.Worker = rec.Attempts[0].Worker
		}
		if h.Lost > 0 && cl.Error == "" {
			cl.Error = fmt.Sprintf("%d attempts lost under SIGTERM", h.Lost)
		}
		if rec.Status != function.StatusSucceeded && cl.Error == "" {
			cl.Error = "record status " + rec.Status
		}
	}
	if werr != nil {
		return calls, fmt.Errorf("evicted worker %s exited with %v", a, werr)
	}
	return calls, nil
}

func onceCheckResult(res *client.Result, counted int64) error {
	if res.FunctionError != nil {
		return fmt.Errorf("function error: %s", res.FunctionError)
	}
	return counter.CheckDraws(res.Payload, onceSteps, counted)
}
