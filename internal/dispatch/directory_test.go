package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// withDirectory gives e's dispatcher a worker directory and returns it.
func (e *env) withDirectory(t *testing.T) *Directory {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir, err := NewDirectory(ctx, e.bus, e.reg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	e.d = New(e.bus, e.reg, e.calls, nil, dir, testenv.Logger(t))
	return dir
}

// publish puts a worker's summary in the directory and waits until dir has it.
func (e *env) publish(t *testing.T, dir *Directory, s api.WorkerSummary) {
	t.Helper()
	body, _ := json.Marshal(s)
	if _, err := e.bus.Workers.Put(testenv.Ctx(t), bus.WorkerKey(s.ID), body); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "directory to show "+s.ID, func() bool {
		dir.mu.Lock()
		defer dir.mu.Unlock()
		w, ok := dir.workers[bus.WorkerKey(s.ID)]
		return ok && w.sum.UpdatedAt == s.UpdatedAt
	})
}

// fakeAddressed answers calls addressed to worker id with its id as the
// result, counting them.
func (e *env) fakeAddressed(t *testing.T, id string) *int {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	sub, err := e.bus.NC.QueueSubscribe(bus.InvokeWorkerSubject(id, "*"), bus.Workers, func(m *nats.Msg) {
		req, _ := callmsg.ParseRequest(m)
		mu.Lock()
		n++
		mu.Unlock()
		_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{CallID: req.CallID, Version: req.Version, Payload: []byte(`"` + id + `"`)}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.bus.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

func summary(id string, running int, holdings ...api.Holding) api.WorkerSummary {
	return api.WorkerSummary{ID: id, UpdatedAt: time.Now().UTC().Format(time.RFC3339Nano), MemoryBudgetMB: 1024,
		Running: running, Holdings: holdings}
}

// Calls go to the worker the directory says holds the version, and to the
// queue group when nobody does or the chosen worker is gone.
func TestInvokePlacement(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.commit(t, "fn")
	e.commit(t, "fn") // v2 is the latest
	e.fakeWorker(t, func(req function.InvokeRequest) *nats.Msg {
		return callmsg.Reply(function.InvokeResult{CallID: req.CallID, Version: req.Version, Payload: []byte(`"any"`)})
	})
	e.fakeAddressed(t, "a")
	e.fakeAddressed(t, "b")
	ctx := testenv.Ctx(t)
	invoke := func(version int) string {
		t.Helper()
		res, err := e.d.Invoke(ctx, function.InvokeRequest{Function: "fn", Version: version})
		if err != nil {
			t.Fatalf("Invoke: %v", err)
		}
		var who string
		_ = json.Unmarshal(res.Payload, &who)
		return who
	}

	if got := invoke(0); got != "any" {
		t.Errorf("with an empty directory the call went to %q, want any worker", got)
	}
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 2}, api.Holding{Function: "fn", Version: 2, Template: true}))
	e.publish(t, dir, summary("b", 0, api.Holding{Function: "fn", Version: 2, Idle: 1}))
	tests := []struct {
		name    string
		version int
		want    string
	}{
		{"latest: the worker with an idle instance", 0, "b"},
		{"pinned version held idle elsewhere", 1, "a"},
		{"same again: still there", 1, "a"},
	}
	for _, tt := range tests {
		if got := invoke(tt.version); got != tt.want {
			t.Errorf("%s: the call went to %q, want %q", tt.name, got, tt.want)
		}
	}

	// b leaves: a's template is the next best place for v2.
	if err := e.bus.Workers.Delete(ctx, bus.WorkerKey("b")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "b to leave the directory", func() bool {
		list, _ := dir.List(ctx)
		return len(list) == 1
	})
	if got := invoke(2); got != "a" {
		t.Errorf("v2 with only a template on a went to %q, want a", got)
	}

	// A worker in the directory that does not answer: the call still runs.
	e.publish(t, dir, summary("c", 0, api.Holding{Function: "fn", Version: 2, Idle: 5}))
	if got := invoke(2); got != "any" {
		t.Errorf("with the chosen worker gone the call went to %q, want any worker", got)
	}
}

// Calls this dispatcher has in flight on a worker claim its idle instances:
// a burst does not pile onto one hot instance.
func TestPlaceCountsCallsInFlight(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	e.publish(t, dir, summary("b", 0, api.Holding{Function: "fn", Version: 1, Template: true}))
	first, done1 := dir.place("fn", 1)
	second, done2 := dir.place("fn", 1)
	if first != "a" || second != "b" {
		t.Errorf("two calls in flight placed on %q and %q, want a (hot) then b (template)", first, second)
	}
	done1(first)
	done2(second)
	if again, done := dir.place("fn", 1); again != "a" {
		t.Errorf("after both answered the call was placed on %q, want a", again)
	} else {
		done("")
	}
	if len(dir.inflight) != 0 {
		t.Errorf("in-flight counts left behind: %v", dir.inflight)
	}
}

func TestDirectoryListAndInfo(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	ctx := testenv.Ctx(t)
	e.publish(t, dir, summary("w2", 1))
	e.publish(t, dir, summary("w1", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	list, err := dir.List(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "w1" || list[1].ID != "w2" || len(list[0].Holdings) != 1 {
		t.Fatalf("List = %+v, %v; want w1 (holding fn) then w2", list, err)
	}

	sub, err := e.bus.NC.QueueSubscribe(bus.WorkerInfoSubject("w1"), bus.Workers, func(m *nats.Msg) {
		body, _ := json.Marshal(api.WorkerInfo{WorkerSummary: api.WorkerSummary{ID: "w1"}, MemAvailableMB: 512,
			Instances: []api.ProcessInfo{{Kind: "instance", Function: "fn", Version: 1, ID: "i-1", Pid: 42, PSS: 1 << 20}}})
		_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	info, err := dir.Info(ctx, "w1")
	if err != nil || info.ID != "w1" || info.MemAvailableMB != 512 || len(info.Instances) != 1 || info.Instances[0].Pid != 42 {
		t.Errorf("Info(w1) = %+v, %v", info, err)
	}
	// Worker x_y answers for x.y too (one subject token): not the one asked for.
	sub, err = e.bus.NC.QueueSubscribe(bus.WorkerInfoSubject("x_y"), bus.Workers, func(m *nats.Msg) {
		body, _ := json.Marshal(api.WorkerInfo{WorkerSummary: api.WorkerSummary{ID: "x_y"}})
		_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	for _, tt := range []struct {
		id   string
		want error
	}{
		{"nope", errdefs.ErrNotFound},
		{"x.y", errdefs.ErrNotFound},
		{"", errdefs.ErrInvalid},
	} {
		if _, err := dir.Info(ctx, tt.id); !errors.Is(err, tt.want) {
			t.Errorf("Info(%q) = %v, want %v", tt.id, err, tt.want)
		}
	}
}

// fakeEvictee answers eviction requests on id's subject as worker answer
// would, and sends each request it gets on the returned channel.
func (e *env) fakeEvictee(t *testing.T, id, answer string) <-chan api.EvictRequest {
	t.Helper()
	asked := make(chan api.EvictRequest, 10)
	sub, err := e.bus.NC.Subscribe(bus.EvictSubject(id), func(m *nats.Msg) {
		var req api.EvictRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid("malformed evict request: " + err.Error())))
			return
		}
		asked <- req
		if req.Reason == "refuse" {
			_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid("grace is too long")))
			return
		}
		grace := req.GraceMS
		if grace == 0 {
			grace = 30000
		}
		body, _ := json.Marshal(api.EvictReport{Worker: answer, Reason: req.Reason, GraceMS: grace, Running: 3})
		_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.bus.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return asked
}

func TestDirectoryEvict(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	ctx := testenv.Ctx(t)
	asked := e.fakeEvictee(t, "w1", "w1")

	for _, tt := range []struct {
		name string
		req  api.EvictRequest
		want api.EvictReport
	}{
		{"defaults", api.EvictRequest{}, api.EvictReport{Worker: "w1", GraceMS: 30000, Running: 3}},
		{"grace and reason", api.EvictRequest{GraceMS: 5000, Reason: "spot reclaim"},
			api.EvictReport{Worker: "w1", Reason: "spot reclaim", GraceMS: 5000, Running: 3}},
	} {
		rep, err := dir.Evict(ctx, "w1", tt.req)
		if err != nil || rep != tt.want {
			t.Errorf("%s: Evict = %+v, %v; want %+v", tt.name, rep, err, tt.want)
		}
		if got := <-asked; got != tt.req {
			t.Errorf("%s: the worker was asked %+v, want %+v", tt.name, got, tt.req)
		}
	}

	// The worker's own refusal keeps its class.
	if _, err := dir.Evict(ctx, "w1", api.EvictRequest{Reason: "refuse"}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "grace is too long") {
		t.Errorf("Evict refused by the worker = %v, want its ErrInvalid", err)
	}
	<-asked

	// Requests that are wrong never reach a worker.
	for _, tt := range []struct {
		name, id string
		req      api.EvictRequest
		want     error
		msg      string
	}{
		{"no worker", "nope", api.EvictRequest{}, errdefs.ErrNotFound, `no worker "nope" is running`},
		{"empty id", "", api.EvictRequest{}, errdefs.ErrInvalid, "invalid worker id"},
		{"long id", strings.Repeat("w", 257), api.EvictRequest{}, errdefs.ErrInvalid, "invalid worker id"},
		{"negative grace", "w1", api.EvictRequest{GraceMS: -1}, errdefs.ErrInvalid, "invalid grace_ms -1"},
		{"grace over a day", "w1", api.EvictRequest{GraceMS: MaxEvictGrace.Milliseconds() + 1}, errdefs.ErrInvalid, "up to 86400000"},
		{"long reason", "w1", api.EvictRequest{Reason: strings.Repeat("é", MaxEvictReasonLen+1)}, errdefs.ErrInvalid, "at most 200"},
	} {
		_, err := dir.Evict(ctx, tt.id, tt.req)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: Evict = %v, want %v with %q", tt.name, err, tt.want, tt.msg)
		}
	}
	if _, err := dir.Evict(ctx, "w1", api.EvictRequest{Reason: strings.Repeat("é", MaxEvictReasonLen)}); err != nil {
		t.Errorf("Evict with a reason of %d characters: %v", MaxEvictReasonLen, err)
	}
	<-asked
	select {
	case req := <-asked:
		t.Errorf("a bad request reached the worker: %+v", req)
	default:
	}

	// Worker x_y has the subject of x.y too. Not in the directory (yet), it
	// answers, and the answer is not taken for x.y's.
	xy := e.fakeEvictee(t, "x_y", "x_y")
	if _, err := dir.Evict(ctx, "x.y", api.EvictRequest{}); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `worker "x_y" answered`) {
		t.Errorf("Evict(x.y) answered by x_y = %v, want ErrNotFound", err)
	}
	<-xy
	// In the directory, it is not asked on x.y's behalf.
	e.publish(t, dir, summary("x_y", 0))
	if _, err := dir.Evict(ctx, "x.y", api.EvictRequest{}); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `worker "x_y" is`) {
		t.Errorf("Evict(x.y) with x_y in the directory = %v, want ErrNotFound", err)
	}
	select {
	case req := <-xy:
		t.Errorf("x_y was asked to evict for x.y: %+v", req)
	default:
	}
}

func TestDirectoryDrop(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.commit(t, "fn")
	ctx := testenv.Ctx(t)

	// No worker: nothing to ask, nothing to wait for.
	start := time.Now()
	if res, err := dir.Drop(ctx, "fn", 0, false); err != nil || res != (api.DropResult{}) || time.Since(start) > time.Second {
		t.Errorf("Drop with no workers = %+v, %v after %s", res, err, time.Since(start))
	}

	asked := make(chan callmsg.Drop, 10)
	for i, id := range []string{"w1", "w2"} {
		sub, err := e.bus.NC.Subscribe(bus.SubjDrop, func(m *nats.Msg) {
			d, err := callmsg.ParseDrop(m)
			if err != nil {
				_ = m.RespondMsg(callmsg.ErrorReply(err))
				return
			}
			asked <- d
			res := api.DropResult{Instances: i + 1, Workers: 1}
			if !d.KeepTemplates {
				res.Templates = 1
			}
			body, _ := json.Marshal(res)
			_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		e.publish(t, dir, summary(id, 0))
	}
	if err := e.bus.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		version int
		keep    bool
		want    api.DropResult
	}{
		{"every version", 0, false, api.DropResult{Instances: 3, Templates: 2, Workers: 2}},
		{"one version, keep templates", 1, true, api.DropResult{Instances: 3, Workers: 2}},
	}
	for _, tt := range tests {
		start := time.Now()
		res, err := dir.Drop(ctx, "fn", tt.version, tt.keep)
		if err != nil || res != tt.want {
			t.Errorf("%s: Drop = %+v, %v; want %+v", tt.name, res, err, tt.want)
		}
		if time.Since(start) > DropWait/2 {
			t.Errorf("%s: Drop took %s although every worker answered", tt.name, time.Since(start))
		}
		for range 2 {
			if d := <-asked; d != (callmsg.Drop{Function: "fn", Version: tt.version, KeepTemplates: tt.keep}) {
				t.Errorf("%s: a worker was asked %+v", tt.name, d)
			}
		}
	}

	// A worker in the directory that does not answer: the others' sum, after DropWait.
	e.publish(t, dir, summary("w3", 0))
	if res, err := dir.Drop(ctx, "fn", 0, false); err != nil || res.Workers != 2 {
		t.Errorf("Drop with a silent worker = %+v, %v; want the 2 answers", res, err)
	}

	for _, tt := range []struct {
		name    string
		fn      string
		version int
		want    error
	}{
		{"unknown function", "nope", 0, errdefs.ErrNotFound},
		{"unknown version", "fn", 9, errdefs.ErrNotFound},
		{"bad name", "a b", 0, errdefs.ErrInvalid},
		{"negative version", "fn", -1, errdefs.ErrInvalid},
	} {
		if _, err := dir.Drop(ctx, tt.fn, tt.version, false); !errors.Is(err, tt.want) {
			t.Errorf("%s: Drop = %v, want %v", tt.name, err, tt.want)
		}
	}
}

// An entry not refreshed for bus.WorkerTTL (its worker died, and the server
// sent no expiry marker) is neither listed nor placed on.
func TestDirectoryIgnoresStaleEntries(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.publish(t, dir, summary("old", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	dir.mu.Lock()
	w := dir.workers["old"]
	w.seen = time.Now().Add(-bus.WorkerTTL)
	dir.workers["old"] = w
	dir.byID["old"] = w
	dir.mu.Unlock()
	if list, _ := dir.List(testenv.Ctx(t)); len(list) != 0 {
		t.Errorf("List = %+v, want no live worker", list)
	}
	if worker, _ := dir.place("fn", 1); worker != "" {
		t.Errorf("a call was placed on the stale worker %q", worker)
	}
}

// A worker that has just answered a call holds an idle instance of its
// version again, even while its last summary (taken during the call) says
// otherwise: back-to-back calls stay on it.
func TestPlaceRemembersWhereCallsReturned(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	worker, done := dir.place("fn", 1)
	if worker != "a" {
		t.Fatalf("placed on %q, want a", worker)
	}
	// While the call runs a reports its instance busy: nothing of fn.
	e.publish(t, dir, summary("a", 1))
	if w, _ := dir.place("fn", 1); w != "" {
		t.Errorf("with a's only instance busy a call was placed on %q", w)
	}
	done("a")
	for i := range 3 {
		w, done := dir.place("fn", 1)
		if w != "a" {
			t.Errorf("call %d after the answer placed on %q, want a", i, w)
		}
		done(w)
	}
	// A call that failed on the platform leaves no such hint.
	dir.mu.Lock()
	clear(dir.returned)
	dir.mu.Unlock()
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	_, done = dir.place("fn", 1)
	e.publish(t, dir, summary("a", 1))
	done("")
	if w, _ := dir.place("fn", 1); w != "" {
		t.Errorf("after a failed call the next was placed on %q, want any worker", w)
	}
	// The hint ends after idleHint; the summaries are the truth again.
	dir.mu.Lock()
	dir.returned["fn@1"] = map[string]time.Time{"a": time.Now().Add(-idleHint)}
	dir.mu.Unlock()
	if w, _ := dir.place("fn", 1); w != "" {
		t.Errorf("an expired hint placed a call on %q", w)
	}
}

// The hint follows the worker that answered: a call that moved (or ran
// again) finished elsewhere, and a call sent to any worker names the one
// that took it.
func TestPlaceFollowsTheWorkerThatAnswered(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	e.publish(t, dir, summary("b", 0))
	e.publish(t, dir, summary("c", 0))
	tests := []struct {
		name       string
		answeredBy string
		want       string
	}{
		{"moved from a to b", "b", "b"},
		{"ran again on c", "c", "c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir.mu.Lock()
			clear(dir.returned)
			dir.mu.Unlock()
			// a's instance left with the call: its summary shows nothing.
			worker, done := dir.place("fn", 1)
			if worker != "a" {
				t.Fatalf("placed on %q, want a", worker)
			}
			e.publish(t, dir, summary("a", 0))
			done(tc.answeredBy)
			w, done := dir.place("fn", 1)
			if w != tc.want {
				t.Errorf("next call placed on %q, want %s", w, tc.want)
			}
			done("")
			e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
		})
	}
	// Sent to any worker (nothing held anywhere): the answer names b.
	dir.mu.Lock()
	clear(dir.returned)
	dir.mu.Unlock()
	e.publish(t, dir, summary("a", 0))
	worker, done := dir.place("fn", 1)
	if worker != "" {
		t.Fatalf("placed on %q with nothing held, want any worker", worker)
	}
	done("b")
	if w, _ := dir.place("fn", 1); w != "b" {
		t.Errorf("after b answered a call sent to any worker, the next was placed on %q, want b", w)
	}
}

// A worker that leaves (an eviction, a shutdown) takes its instances with
// it: calls are not placed on its hint when a worker of the same id
// starts again.
func TestPlaceForgetsHintsOfWorkersThatLeft(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	answeredOnA(t, e, dir)
	if err := e.bus.Workers.Delete(testenv.Ctx(t), bus.WorkerKey("a")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "directory to drop a", func() bool {
		dir.mu.Lock()
		defer dir.mu.Unlock()
		_, ok := dir.byID["a"]
		return !ok
	})
	e.publish(t, dir, summary("a", 0)) // started again, empty
	if w, _ := dir.place("fn", 1); w != "" {
		t.Errorf("a call was placed on %q, which started again with nothing", w)
	}
}

// A draining worker (evicted, its calls still moving) takes no new calls,
// whatever it holds or last answered, but is not dead while its entry
// stays fresh.
func TestPlaceSkipsDrainingWorkers(t *testing.T) {
	e := newEnv(t)
	dir := e.withDirectory(t)
	answeredOnA(t, e, dir)
	s := summary("a", 1, api.Holding{Function: "fn", Version: 1, Idle: 1})
	s.Draining = true
	e.publish(t, dir, s)
	if w, _ := dir.place("fn", 1); w != "" {
		t.Errorf("a call was placed on the draining worker %q", w)
	}
	if dir.Dead("a") {
		t.Error("a draining worker with a fresh entry is dead")
	}
	if list, _ := dir.List(testenv.Ctx(t)); len(list) != 1 || !list[0].Draining {
		t.Errorf("List() = %+v, want a, draining", list)
	}
}

// answeredOnA publishes worker a holding an idle instance of fn@1, and
// places a call of it there that a answers: a has the placement hint.
func answeredOnA(t *testing.T, e *env, dir *Directory) {
	t.Helper()
	e.publish(t, dir, summary("a", 0, api.Holding{Function: "fn", Version: 1, Idle: 1}))
	worker, done := dir.place("fn", 1)
	if worker != "a" {
		t.Fatalf("placed on %q, want a", worker)
	}
	done("a")
}
