package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/internal/worker"
)

// withGrace sets a worker's eviction grace period.
func withGrace(d time.Duration) nodeOption {
	return func(c *worker.Config, _ *sandbox.Config) { c.EvictionGrace = d }
}

// stepsCode runs event["steps"] steps of event["ms"] ms each, folding
// random numbers into a checksum: a long call with state in its frames.
const stepsCode = `import os, random, time, hashlib
def handler(event, context):
    h = hashlib.sha256()
    pids = []
    for i in range(event["steps"]):
        time.sleep(event.get("ms", 10) / 1000)
        h.update(repr((i, random.random())).encode())
        if os.getpid() not in pids:
            pids.append(os.getpid())
    return {"steps": event["steps"], "sum": h.hexdigest(), "pids": pids}
`

type stepsResult struct {
	Steps int    `json:"steps"`
	Sum   string `json:"sum"`
	Pids  []int  `json:"pids"`
}

// outcome is the answer to a call made in a goroutine (goInvoke).
type outcome struct {
	res function.InvokeResult
	err error
}

// goInvoke makes a call in a goroutine and sends its answer to done.
func goInvoke(done chan<- outcome, invoke func() (function.InvokeResult, error)) {
	go func() {
		res, err := invoke()
		done <- outcome{res, err}
	}()
}

// awaitSucceeded waits up to within for the next answer on done and fails
// the test unless its call succeeded.
func awaitSucceeded(t *testing.T, done <-chan outcome, within time.Duration, what string) function.InvokeResult {
	t.Helper()
	select {
	case o := <-done:
		if o.err != nil || o.res.Err != nil {
			t.Fatalf("%s: err %v, function error %+v", what, o.err, o.res.Err)
		}
		return o.res
	case <-time.After(within):
		t.Fatalf("%s: no answer within %s", what, within)
	}
	return function.InvokeResult{}
}

// stepsOf decodes the result of stepsCode and checks its step count.
func stepsOf(t *testing.T, res function.InvokeResult, steps int) stepsResult {
	t.Helper()
	var r stepsResult
	if err := json.Unmarshal(res.Payload, &r); err != nil || r.Steps != steps {
		t.Fatalf("result %s (want %d steps): %v", res.Payload, steps, err)
	}
	return r
}

// deploySpec deploys app.py = code with spec.
func (n node) deploySpec(t *testing.T, spec function.Spec, code string) {
	t.Helper()
	zip, err := codezip.FromFiles(map[string]string{"app.py": code})
	if err != nil {
		t.Fatal(err)
	}
	if spec.Runtime == "" {
		spec.Runtime, spec.Handler = "python3", "app.handler"
	}
	if _, err := n.d.Deploy(testenv.Ctx(t), spec, zip); err != nil {
		t.Fatal(err)
	}
}

// TestEvictionMovesRunningCall: a sync call runs on worker a; a is evicted
// in the middle of it; the call finishes on b and its caller gets the
// result as if nothing had happened. The record shows both hops.
func TestEvictionMovesRunningCall(t *testing.T) {
	c := newCluster(t, nil)
	a := newNode(t, c.bus, c.store, c.keys, "a", withGrace(10*time.Second))
	a.deploySpec(t, function.Spec{Name: "steps", TimeoutSec: 60}, stepsCode)
	b := newNode(t, c.bus, c.store, c.keys, "b", withGrace(10*time.Second))

	done := make(chan outcome, 1)
	id := function.NewCallID()
	goInvoke(done, func() (function.InvokeResult, error) {
		// Through a's in-process path: a holds the validated instance.
		return a.w.Serve(testenv.Ctx(t), function.InvokeRequest{Function: "steps", Version: 1, CallID: id,
			Payload: []byte(`{"steps": 100, "ms": 10}`)})
	})
	time.Sleep(400 * time.Millisecond)
	// The worker's info lists the running call's instance as busy.
	busy := 0
	for _, p := range a.w.Info().Instances {
		if p.State == "busy" {
			busy++
		}
	}
	if busy != 1 {
		t.Errorf("worker info shows %d busy instances while the call runs, want 1", busy)
	}
	rep := a.w.Evict(context.Background(), 10*time.Second, "test")
	t.Logf("eviction: %+v", rep)
	if rep.Moved != 1 {
		t.Errorf("eviction moved %d calls, want 1", rep.Moved)
	}
	r := stepsOf(t, awaitSucceeded(t, done, 60*time.Second, "the moved call"), 100)
	if len(r.Sum) != 64 {
		t.Errorf("result %+v", r)
	}
	if len(r.Pids) != 1 {
		t.Errorf("the handler saw pids %v: a restored process keeps its pid", r.Pids)
	}
	call, err := b.d.Call(testenv.Ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.MarshalIndent(call, "", "  ")
	t.Logf("record: %s", js)
	if call.Status != function.StatusSucceeded || len(call.Attempts) != 2 {
		t.Fatalf("record: status %s, %d attempts", call.Status, len(call.Attempts))
	}
	first, second := call.Attempts[0], call.Attempts[1]
	// The call's start, not its instance's: the validated instance was
	// reused (hot), though it started cold.
	if first.Worker != "a" || first.Start != function.StartHot || first.Outcome != function.OutcomeCheckpointed || first.Reason != function.ReasonEviction ||
		first.Snapshot == "" || first.CheckpointMS <= 0 || first.ImageBytes <= 0 {
		t.Errorf("first hop %+v", first)
	}
	if second.Worker != "b" || second.Start != function.StartResume || second.Outcome != function.StatusSucceeded ||
		second.Snapshot != first.Snapshot || second.RestoreMS <= 0 {
		t.Errorf("second hop %+v", second)
	}
}

// TestCallerGoneIsNotRunAgain: a call served in-process whose caller
// goes away ends there: it is not taken for one its worker gave up, and
// no worker, this one included, runs it again.
func TestCallerGoneIsNotRunAgain(t *testing.T) {
	c := newCluster(t, nil)
	a := c.node(t, "a")
	a.deploySpec(t, function.Spec{Name: "steps", TimeoutSec: 60}, stepsCode)
	if res, err := a.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "steps", Payload: []byte(`{"steps": 1}`)}); err != nil || res.Err != nil {
		t.Fatalf("warm-up call: %v %+v", err, res.Err)
	}
	b := c.node(t, "b")
	ctx, cancel := context.WithCancel(testenv.Ctx(t))
	done := make(chan outcome, 1)
	goInvoke(done, func() (function.InvokeResult, error) {
		return a.d.Invoke(ctx, function.InvokeRequest{Function: "steps", Payload: []byte(`{"steps": 300, "ms": 10}`)})
	})
	testenv.Eventually(t, 10*time.Second, "the call running on a", func() bool { return a.w.Summary().Running == 1 })
	cancel()
	select {
	case o := <-done:
		if o.err == nil {
			t.Fatalf("the call answered %s after its caller went away", o.res.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call's caller went away, and the call still ran")
	}
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // longer than the call
		if ra, rb := a.w.Summary().Running, b.w.Summary().Running; ra+rb != 0 {
			t.Fatalf("after its caller went away the call runs again: %d running on a, %d on b", ra, rb)
		}
	}
}

// TestSlicedCallRunsPastItsTimeout: a function whose max duration is
// longer than its timeout runs in slices of at most the timeout, each
// ended by a checkpoint and resumed from it; past the max duration it
// times out like any call.
func TestSlicedCallRunsPastItsTimeout(t *testing.T) {
	c := newCluster(t, nil)
	a := c.node(t, "a")
	a.deploySpec(t, function.Spec{Name: "sliced", TimeoutSec: 1, MaxDurationSec: 6}, stepsCode)
	res, err := a.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "sliced", Payload: []byte(`{"steps": 250, "ms": 10}`)})
	if err != nil || res.Err != nil {
		t.Fatalf("sliced call: err %v, function error %+v", err, res.Err)
	}
	stepsOf(t, res, 250)
	call, err := a.d.Call(testenv.Ctx(t), res.CallID)
	if err != nil {
		t.Fatal(err)
	}
	if call.Status != function.StatusSucceeded || len(call.Attempts) < 3 {
		t.Fatalf("record: status %s, %d attempts (want >= 3 slices of a >= 2.5 s call): %+v", call.Status, len(call.Attempts), call.Attempts)
	}
	var total float64
	for i, at := range call.Attempts {
		last := i == len(call.Attempts)-1
		if !last && (at.Outcome != function.OutcomeCheckpointed || at.Reason != function.ReasonSlice || at.RunMS > 1000) {
			t.Errorf("slice %d: %+v (want checkpointed at the slice end, run <= 1000 ms)", i, at)
		}
		if i > 0 && at.Start != function.StartResume {
			t.Errorf("slice %d started %q, want resume", i, at.Start)
		}
		total += at.RunMS
	}
	total += call.DurationMS
	if total < 2500 {
		t.Errorf("the slices ran %.0f ms in all; the call needs >= 2500 ms", total)
	}

	// Longer than the max duration: timed out, after its slices.
	res, err = a.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "sliced", Payload: []byte(`{"steps": 1000, "ms": 10}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Err == nil || res.Err.ErrorType != "Sandbox.Timedout" {
		t.Fatalf("a call past its max duration: %+v, want Sandbox.Timedout", res.Err)
	}
	t.Logf("past the max duration: %s", res.Err.ErrorMessage)
}

// TestEvictionOfManyCalls: an eviction with more calls than checkpoints
// run at once moves them all in time; with a grace too short for all, the
// rest are given up and run again from the start on the other worker —
// every caller gets its result, and the eviction ends on time.
func TestEvictionOfManyCalls(t *testing.T) {
	tests := []struct {
		name      string
		grace     time.Duration
		wantMoved bool // every call moved; else some ran again
	}{
		{"grace enough for all", 20 * time.Second, true},
		{"grace too short", 150 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, nil)
			a := newNode(t, c.bus, c.store, c.keys, "a", withGrace(20*time.Second))
			a.deploySpec(t, function.Spec{Name: "steps", TimeoutSec: 120}, stepsCode)
			const n = 9 // more than twice the checkpoints a worker takes at once
			done := make(chan outcome, n)
			for range n {
				goInvoke(done, func() (function.InvokeResult, error) {
					return a.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "steps", Payload: []byte(`{"steps": 300, "ms": 10}`)})
				})
			}
			testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d calls running on a", n), func() bool { return a.w.Summary().Running == n })
			b := newNode(t, c.bus, c.store, c.keys, "b", withGrace(20*time.Second))
			start := time.Now()
			rep := a.w.Evict(context.Background(), tt.grace, "test")
			took := time.Since(start)
			t.Logf("eviction: %+v in %s", rep, took)
			if took > tt.grace+15*time.Second {
				t.Errorf("the eviction took %s with a grace of %s", took, tt.grace)
			}
			if tt.wantMoved && rep.Moved != n {
				t.Errorf("moved %d of %d calls", rep.Moved, n)
			}
			lost := 0
			for range n {
				res := awaitSucceeded(t, done, 90*time.Second, "a call")
				stepsOf(t, res, 300)
				var call function.Call
				testenv.Eventually(t, 10*time.Second, "the record of "+res.CallID, func() bool {
					var err error
					call, err = b.d.Call(testenv.Ctx(t), res.CallID)
					return err == nil && call.Status == function.StatusSucceeded
				})
				for _, at := range call.Attempts {
					if at.Outcome == function.OutcomeLost && at.Worker == "a" && at.Reason == function.ReasonEviction {
						lost++
					}
				}
			}
			if moved := rep.Moved; moved+lost != n {
				t.Errorf("%d calls moved and %d records show an attempt lost to the eviction; want %d in all", moved, lost, n)
			}
		})
	}
}

// libsAfterRestoreCode imports hashlib only after the call moved: its
// first use of OpenSSL takes glibc rwlocks, which check the calling
// thread's id as glibc keeps it in the thread's memory.
const libsAfterRestoreCode = `import time
def handler(event, context):
    for _ in range(event["steps"]):
        time.sleep(0.01)
    import hashlib
    return {"digest": hashlib.sha256(b"torpor").hexdigest()}
`

// TestMovedCallsKeepTheirThreadIDs: calls moved together from a worker (on
// the host's network, where dumps take longest) use OpenSSL after the
// restore. A dump whose image pipes were read after CRIU killed the
// process used to hold the thread-id words the kernel clears at exit:
// most such calls then crashed in the first rwlock they took.
func TestMovedCallsKeepTheirThreadIDs(t *testing.T) {
	for round := range 2 {
		c := newCluster(t, nil)
		opts := []nodeOption{withGrace(60 * time.Second), withHostNetwork}
		a := newNode(t, c.bus, c.store, c.keys, "a", opts...)
		a.deploySpec(t, function.Spec{Name: "libs", TimeoutSec: 120}, libsAfterRestoreCode)
		const n = 4
		done := make(chan outcome, n)
		for range n {
			goInvoke(done, func() (function.InvokeResult, error) {
				return a.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "libs", Payload: []byte(`{"steps": 300}`)})
			})
		}
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d calls running on a", n), func() bool { return a.w.Summary().Running == n })
		newNode(t, c.bus, c.store, c.keys, "b", opts...)
		if rep := a.w.Evict(context.Background(), 60*time.Second, "test"); rep.Moved != n {
			t.Errorf("round %d: moved %d of %d calls", round, rep.Moved, n)
		}
		for range n {
			res := awaitSucceeded(t, done, 2*time.Minute, fmt.Sprintf("round %d: a moved call (after its restore)", round))
			if !strings.Contains(string(res.Payload), "digest") {
				t.Fatalf("round %d: result %s", round, res.Payload)
			}
		}
	}
}
