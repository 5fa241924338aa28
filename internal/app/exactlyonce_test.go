package app_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/counter"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/internal/worker"
)

func withHostNetwork(c *worker.Config, _ *sandbox.Config) { c.HostNetwork = true }

// TestExactlyOnceUnderRandomEvictions is the exactly-once proof: trials
// (TORPOR_EXACTLY_ONCE_TRIALS, default 100) each run a call and evict its
// worker at a uniformly random instant of it; the call moves to the other
// worker, and a fresh worker replaces the evicted one. Every result and
// every counter must equal those of an uninterrupted run.
func TestExactlyOnceUnderRandomEvictions(t *testing.T) {
	trials := 100
	if v, err := strconv.Atoi(os.Getenv("TORPOR_EXACTLY_ONCE_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	c := newCluster(t, nil)
	ctr, err := counter.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctr.Close() })
	const grace, steps, stepMS = 10 * time.Second, 30, 10
	opts := []nodeOption{withGrace(grace), withHostNetwork}
	cur := newNode(t, c.bus, c.store, c.keys, "w0", opts...)
	cur.deploySpec(t, function.Spec{Name: "once", TimeoutSec: 60}, counter.DrawsCode)
	other := newNode(t, c.bus, c.store, c.keys, "w1", opts...)
	event := func(key string) []byte { return counter.DrawsEvent(ctr.URL(), key, steps, stepMS) }
	// Uninterrupted runs: the reference the checks encode, and the call's
	// duration, over which eviction instants are drawn.
	var dur time.Duration
	for i := range 3 {
		key := "plain-" + strconv.Itoa(i)
		t0 := time.Now()
		res, err := cur.w.Serve(testenv.Ctx(t), function.InvokeRequest{Function: "once", Version: 1, CallID: function.NewCallID(), Payload: event(key)})
		dur = max(dur, time.Since(t0))
		if err != nil || res.Err != nil {
			t.Fatalf("uninterrupted call: %v %+v", err, res.Err)
		}
		if err := counter.CheckDraws(res.Payload, steps, ctr.Value(key)); err != nil {
			t.Fatalf("uninterrupted call: %v", err)
		}
	}
	moved := 0
	for i := range trials {
		key := "trial-" + strconv.Itoa(i)
		id := function.NewCallID()
		at := time.Duration(rand.Int64N(int64(dur)))
		done := make(chan outcome, 1)
		evicted := cur
		goInvoke(done, func() (function.InvokeResult, error) {
			return evicted.w.Serve(testenv.Ctx(t), function.InvokeRequest{Function: "once", Version: 1, CallID: id, Payload: event(key)})
		})
		time.Sleep(at)
		rep := evicted.w.Evict(context.Background(), grace, "trial "+strconv.Itoa(i))
		moved += rep.Moved
		res := awaitSucceeded(t, done, 2*time.Minute, fmt.Sprintf("trial %d (evicted at %s)", i, at))
		if err := counter.CheckDraws(res.Payload, steps, ctr.Value(key)); err != nil {
			t.Fatalf("trial %d (evicted at %s of ~%s, moved %d): %v", i, at, dur, rep.Moved, err)
		}
		// The call ended on the other worker, whose instance is now hot:
		// it runs the next trial, and a new worker stands by.
		cur, other = other, newNode(t, c.bus, c.store, c.keys, "w"+strconv.Itoa(i+2), opts...)
	}
	t.Logf("%d trials, %d calls moved mid-call, all exactly once (call ~%s)", trials, moved, dur)
	if moved < trials/2 {
		t.Errorf("only %d of %d trials moved a call mid-call: the eviction instants miss the calls", moved, trials)
	}
}
