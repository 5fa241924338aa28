package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/bench"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// The migration tests run torpor as a platform engineer would on several
// nodes: `torpor gateway` with the embedded NATS, two `torpor worker`
// processes with homes of their own, and a real MinIO as the snapshot
// store.

// migrationCode runs event["steps"] steps of 10 ms and returns a checksum
// of its random draws, and the pid it ran as (a restored process keeps it).
const migrationCode = `import hashlib, os, random, time
def handler(event, context):
    h = hashlib.sha256()
    for i in range(event["steps"]):
        time.sleep(0.01)
        h.update(repr(random.random()).encode())
    return {"steps": event["steps"], "sum": h.hexdigest()}
`

type migrationResult struct {
	Steps int    `json:"steps"`
	Sum   string `json:"sum"`
}

// startMigrationCluster starts a gateway and two workers over a fresh MinIO.
func startMigrationCluster(t *testing.T, extra ...string) (*bench.Cluster, *client.Client) {
	t.Helper()
	m := testenv.MinIO(t)
	store := "s3://torpor-e2e?endpoint=" + url.QueryEscape(m.Endpoint) + "&path_style=true"
	ctx := longCtx(t)
	st, err := s3store.New(ctx, s3store.Config{Endpoint: m.Endpoint, Bucket: "torpor-e2e", AccessKey: m.AccessKey,
		SecretKey: m.SecretKey, PathStyle: true})
	if err == nil {
		err = st.EnsureBucket(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := bench.StartCluster(ctx, bench.ClusterConfig{Binary: torporBin, Dir: dir, Workers: 2, Store: store,
		// A short ack wait: the async call of a killed worker is
		// redelivered within seconds.
		Extra:        append([]string{"--eviction-grace=20s", "--templates=false", "--ack-wait=2s"}, extra...),
		GatewayExtra: []string{"--ack-wait=2s"},
		Env:          []string{"AWS_ACCESS_KEY_ID=" + m.AccessKey, "AWS_SECRET_ACCESS_KEY=" + m.SecretKey},
		Log:          testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			for _, n := range append([]string{"gateway"}, c.Workers()...) {
				b, _ := os.ReadFile(filepath.Join(dir, n+".log"))
				t.Logf("log of %s:\n%s", n, tail(string(b), 60000))
			}
		}
	})
	cl, err := client.New(c.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	zip, err := codezip.FromFiles(map[string]string{"app.py": migrationCode})
	if err != nil {
		t.Fatal(err)
	}
	// A timeout past the grace period: calls run on instances that can
	// be checkpointed on their own.
	if _, err := cl.Deploy(ctx, function.Spec{Name: "steps", Runtime: "python3", Handler: "app.handler", TimeoutSec: 120}, zip); err != nil {
		t.Fatal(err)
	}
	return c, cl
}

type outcome struct {
	res *client.Result
	err error
}

// twoCallsOnW1 starts a sync and an async call of steps steps, both on
// worker w1 (w2 is stopped meanwhile, then started again), and returns
// once both run: the sync call's outcome arrives on the channel.
func twoCallsOnW1(t *testing.T, ctx context.Context, c *bench.Cluster, cl *client.Client, steps int) (chan outcome, function.Call, string) {
	t.Helper()
	if err := c.Signal("w2", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "w2"); err != nil {
		t.Fatal(err)
	}
	event := []byte(fmt.Sprintf(`{"steps": %d}`, steps))
	sync := make(chan outcome, 1)
	go func() {
		res, err := cl.Invoke(ctx, "steps", 0, event)
		sync <- outcome{res, err}
	}()
	async, err := cl.InvokeAsync(ctx, "steps", 0, event)
	if err != nil {
		t.Fatal(err)
	}
	victim := runningOn(t, cl, 2)
	if err := c.Restart(ctx, "w2"); err != nil {
		t.Fatal(err)
	}
	return sync, async, victim
}

// runningOn waits until some worker runs n calls, and names it.
func runningOn(t *testing.T, cl *client.Client, n int) string {
	t.Helper()
	var on string
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d calls running on one worker", n), func() bool {
		ws, err := cl.Workers(testenv.Ctx(t))
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.Running >= n {
				on = w.ID
				return true
			}
		}
		return false
	})
	return on
}

// TestSIGTERMMovesCalls: SIGTERM to the worker running a sync and an async
// call moves both to the other worker; the sync caller gets its result as
// if nothing had happened, the async call completes, and both records show
// the hop. Then the evict route does the same to the other worker.
func TestSIGTERMMovesCalls(t *testing.T) {
	c, cl := startMigrationCluster(t)
	ctx := longCtx(t)
	sync, async, victim := twoCallsOnW1(t, ctx, c, cl, 300)
	if err := c.Signal(victim, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, victim); err != nil {
		t.Errorf("evicted worker %s: %v", victim, err)
	}
	var o outcome
	select {
	case o = <-sync:
	case <-time.After(90 * time.Second):
		t.Fatal("the sync call never returned")
	}
	if o.err != nil || o.res.FunctionError != nil {
		t.Fatalf("sync call: %v %+v", o.err, o.res)
	}
	checkSteps(t, o.res.Payload, 300)
	testenv.Eventually(t, 60*time.Second, "the async call done", func() bool {
		call, err := cl.Call(ctx, async.ID)
		return err == nil && call.Status == function.StatusSucceeded
	})
	moved := 0
	for _, id := range []string{o.res.CallID, async.ID} {
		var call function.Call
		testenv.Eventually(t, 30*time.Second, "the record of "+id+" complete", func() bool {
			c, err := cl.Call(ctx, id)
			call = c
			return err == nil && call.Status == function.StatusSucceeded
		})
		checkSteps(t, call.Result, 300)
		for _, a := range call.Attempts {
			if a.Outcome == function.OutcomeCheckpointed && a.Worker == victim && a.ImageBytes > 0 {
				moved++
			}
		}
		js, _ := json.Marshal(call.Attempts)
		t.Logf("call %s (%s): %s", id, call.Mode, js)
	}
	if moved != 2 {
		t.Errorf("%d calls show a checkpointed hop on %s, want both", moved, victim)
	}

	// The evict route, on the worker that took the calls over.
	if err := c.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	go func() {
		res, err := cl.Invoke(ctx, "steps", 0, []byte(`{"steps": 300}`))
		sync <- outcome{res, err}
	}()
	other := runningOn(t, cl, 1)
	rep, err := cl.Evict(ctx, other, api.EvictRequest{GraceMS: 20000, Reason: "e2e"})
	if err != nil || rep.Worker != other {
		t.Fatalf("evict %s: %+v %v", other, rep, err)
	}
	if err := c.Wait(ctx, other); err != nil {
		t.Errorf("evicted worker %s: %v", other, err)
	}
	select {
	case o = <-sync:
	case <-time.After(90 * time.Second):
		t.Fatal("the sync call never returned after the evict request")
	}
	if o.err != nil || o.res.FunctionError != nil {
		t.Fatalf("sync call: %v %+v", o.err, o.res)
	}
	checkSteps(t, o.res.Payload, 300)
}

// TestRerunsWithoutCheckpoint: a worker that goes away without
// checkpointing its calls — killed without notice (SIGKILL), or evicted
// with no grace period (the re-run policy) — leaves them to run again
// from the start on the other worker (at least once); their records say
// which attempt was lost, and why.
func TestRerunsWithoutCheckpoint(t *testing.T) {
	tests := []struct {
		name   string
		sig    syscall.Signal
		extra  []string
		reason string
	}{
		{"SIGKILL", syscall.SIGKILL, nil, function.ReasonCrash},
		{"SIGTERM without grace", syscall.SIGTERM, []string{"--eviction-grace=0"}, function.ReasonEviction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, cl := startMigrationCluster(t, tt.extra...)
			ctx := longCtx(t)
			sync, async, victim := twoCallsOnW1(t, ctx, c, cl, 600)
			if err := c.Signal(victim, tt.sig); err != nil {
				t.Fatal(err)
			}
			_ = c.Wait(ctx, victim)
			var o outcome
			select {
			case o = <-sync:
			case <-time.After(2 * time.Minute):
				t.Fatal("the sync call never returned")
			}
			if o.err != nil || o.res.FunctionError != nil {
				t.Fatalf("sync call: %v %+v", o.err, o.res)
			}
			checkSteps(t, o.res.Payload, 600)
			if !testenv.Within(90*time.Second, func() bool {
				call, err := cl.Call(ctx, async.ID)
				return err == nil && (call.Status == function.StatusSucceeded || call.Status == function.StatusFailed)
			}) {
				call, err := cl.Call(ctx, async.ID)
				t.Fatalf("the async call is not done after 90 s: %+v %v", call, err)
			}
			lost := 0
			for _, id := range []string{o.res.CallID, async.ID} {
				var call function.Call
				testenv.Eventually(t, 30*time.Second, "the record of "+id+" complete", func() bool {
					c, err := cl.Call(ctx, id)
					call = c
					return err == nil && call.Status == function.StatusSucceeded
				})
				js, _ := json.Marshal(call.Attempts)
				t.Logf("call %s (%s): %s", id, call.Mode, js)
				for _, a := range call.Attempts {
					if a.Outcome == function.OutcomeLost && a.Reason == tt.reason && a.Worker == victim {
						lost++
					}
				}
			}
			if lost != 2 {
				t.Errorf("%d records show the attempt lost (%s) on %s, want both", lost, tt.reason, victim)
			}
		})
	}
}

// longCtx is a test's context for calls that outlive testenv.Ctx's 30 s.
func longCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func checkSteps(t *testing.T, payload []byte, steps int) {
	t.Helper()
	var r migrationResult
	if err := json.Unmarshal(payload, &r); err != nil || r.Steps != steps || len(r.Sum) != 64 {
		t.Errorf("result %s: %v", payload, err)
	}
}

// TestCloudNoticeEvicts: a worker polling GCP's metadata server (a local
// one serving the documented format) evicts itself and exits when the
// instance is marked preempted.
func TestCloudNoticeEvicts(t *testing.T) {
	var preempted atomic.Bool
	md := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/computeMetadata/v1/instance/preempted" || r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		if preempted.Load() {
			fmt.Fprint(w, "TRUE")
		} else {
			fmt.Fprint(w, "FALSE")
		}
	}))
	defer md.Close()
	s := startServer(t, "--eviction-notice=gcp", "--metadata-url="+md.URL, "--eviction-poll=100ms")
	time.Sleep(300 * time.Millisecond)
	select {
	case <-s.done:
		t.Fatal("the worker exited before any notice")
	default:
	}
	preempted.Store(true)
	select {
	case <-s.done:
	case <-time.After(40 * time.Second):
		t.Fatal("the worker did not exit after the preemption notice")
	}
	out := s.out.String()
	if !strings.Contains(out, "gcp eviction notice") || !strings.Contains(out, "eviction over") {
		t.Errorf("the log does not show the eviction:\n%s", tail(out, 4000))
	}
}
