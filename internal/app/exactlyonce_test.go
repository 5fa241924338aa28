package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
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

// ExactlyOnceCode is the exactly-once proof's function: it draws random
// 64-bit numbers (non-deterministic work), hashes them, and at the steps
// whose number is divisible by 4 (points chosen at random) increments an
// external counter over HTTP. Its result lets the test recompute what an
// uninterrupted run of the same draws gives: the hash and the increments.
const exactlyOnceCode = `import hashlib, random, time, urllib.request
def handler(event, context):
    h = hashlib.sha256()
    xs, incs = [], 0
    for i in range(event["steps"]):
        x = random.getrandbits(64)
        xs.append(x)
        h.update(x.to_bytes(8, "big"))
        time.sleep(event["ms"] / 1000)
        if x % 4 == 0:
            req = urllib.request.Request(event["counter"] + "/inc?key=" + event["key"], method="POST")
            urllib.request.urlopen(req, timeout=10).read()
            incs += 1
    return {"xs": xs, "sum": h.hexdigest(), "incs": incs}
`

type exactlyOnceResult struct {
	Xs   []uint64 `json:"xs"`
	Sum  string   `json:"sum"`
	Incs int      `json:"incs"`
}

// check compares r and the counter's value for its key with what an
// uninterrupted run of the same draws gives.
func (r exactlyOnceResult) check(steps int, counted int64) error {
	h := sha256.New()
	want := 0
	for _, x := range r.Xs {
		h.Write(binary.BigEndian.AppendUint64(nil, x))
		if x%4 == 0 {
			want++
		}
	}
	switch {
	case len(r.Xs) != steps:
		return fmt.Errorf("%d draws, want %d", len(r.Xs), steps)
	case hex.EncodeToString(h.Sum(nil)) != r.Sum:
		return fmt.Errorf("checksum %s does not match the draws", r.Sum)
	case r.Incs != want:
		return fmt.Errorf("the function counted %d increments, its draws call for %d", r.Incs, want)
	case counted != int64(want):
		return fmt.Errorf("the counter saw %d increments, the draws call for %d", counted, want)
	}
	return nil
}

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
	cur.deploySpec(t, function.Spec{Name: "once", TimeoutSec: 60}, exactlyOnceCode)
	other := newNode(t, c.bus, c.store, c.keys, "w1", opts...)
	event := func(key string) []byte {
		b, _ := json.Marshal(map[string]any{"steps": steps, "ms": stepMS, "counter": ctr.URL(), "key": key})
		return b
	}
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
		var r exactlyOnceResult
		if err := json.Unmarshal(res.Payload, &r); err != nil {
			t.Fatal(err)
		}
		if err := r.check(steps, ctr.Value(key)); err != nil {
			t.Fatalf("uninterrupted call: %v", err)
		}
	}
	moved := 0
	for i := range trials {
		key := "trial-" + strconv.Itoa(i)
		id := function.NewCallID()
		at := time.Duration(rand.Int64N(int64(dur)))
		type outcome struct {
			res function.InvokeResult
			err error
		}
		done := make(chan outcome, 1)
		evicted := cur
		go func() {
			res, err := evicted.w.Serve(testenv.Ctx(t), function.InvokeRequest{Function: "once", Version: 1, CallID: id, Payload: event(key)})
			done <- outcome{res, err}
		}()
		time.Sleep(at)
		rep := evicted.w.Evict(context.Background(), grace, "trial "+strconv.Itoa(i))
		moved += rep.Moved
		var o outcome
		select {
		case o = <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("trial %d (evicted at %s): the call never returned", i, at)
		}
		if o.err != nil || o.res.Err != nil {
			t.Fatalf("trial %d (evicted at %s): err %v, function error %+v", i, at, o.err, o.res.Err)
		}
		var r exactlyOnceResult
		if err := json.Unmarshal(o.res.Payload, &r); err != nil {
			t.Fatalf("trial %d: %v", i, err)
		}
		if err := r.check(steps, ctr.Value(key)); err != nil {
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
