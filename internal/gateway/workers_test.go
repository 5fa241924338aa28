package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// fakeWorkers is a worker directory of fixed workers.
type fakeWorkers struct {
	list  []api.WorkerSummary
	infos map[string]api.WorkerInfo
	fns   map[string]int // function → latest version

	mu      sync.Mutex
	dropped []string // "fn version keep"
	evicted []api.EvictRequest
}

func (f *fakeWorkers) List(context.Context) ([]api.WorkerSummary, error) { return f.list, nil }

func (f *fakeWorkers) Info(_ context.Context, id string) (api.WorkerInfo, error) {
	info, ok := f.infos[id]
	if !ok {
		return info, errdefs.NotFound(fmt.Sprintf("no worker %q is running", id))
	}
	return info, nil
}

func (f *fakeWorkers) Drop(_ context.Context, name string, version int, keep bool) (api.DropResult, error) {
	if latest, ok := f.fns[name]; !ok || version > latest {
		return api.DropResult{}, errdefs.NotFound(fmt.Sprintf("function %s not found", name))
	}
	f.mu.Lock()
	f.dropped = append(f.dropped, fmt.Sprint(name, " ", version, " ", keep))
	f.mu.Unlock()
	res := api.DropResult{Instances: 3, Workers: 2}
	if !keep {
		res.Templates = 1
	}
	return res, nil
}

// Evict validates as the directory does, then has worker id report 2
// calls running.
func (f *fakeWorkers) Evict(_ context.Context, id string, req api.EvictRequest) (api.EvictReport, error) {
	if req.GraceMS < 0 {
		return api.EvictReport{}, errdefs.Invalid(fmt.Sprintf("invalid grace_ms %d: use 0 (the worker's --eviction-grace) or more", req.GraceMS))
	}
	if _, ok := f.infos[id]; !ok {
		return api.EvictReport{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running", id))
	}
	f.mu.Lock()
	f.evicted = append(f.evicted, req)
	f.mu.Unlock()
	grace, reason := req.GraceMS, req.Reason
	if grace == 0 {
		grace = 30000
	}
	if reason == "" {
		reason = "evict request"
	}
	return api.EvictReport{Worker: id, Reason: reason, GraceMS: grace, Running: 2}, nil
}

func newWorkersServer(t *testing.T, wk Workers) *testServer {
	t.Helper()
	b := gatewaytest.NewBackend()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := Options{Log: log, Registry: reg}
	if wk != nil {
		opts.Workers = wk
	}
	ts := httptest.NewServer(New(b, opts))
	t.Cleanup(ts.Close)
	return &testServer{Server: ts, b: b, reg: reg}
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return v
}

func TestListWorkers(t *testing.T) {
	for _, tt := range []struct {
		name string
		list []api.WorkerSummary
		want string
	}{
		{"none", nil, `{"workers":[]}`},
		{"two", []api.WorkerSummary{
			{ID: "w1", MemoryBudgetMB: 1024, ReservedMB: 128, Running: 1, Holdings: []api.Holding{{Function: "fn", Version: 1, Idle: 1, Template: true}}},
			{ID: "w2", MemoryBudgetMB: 2048},
		}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ts := newWorkersServer(t, &fakeWorkers{list: tt.list})
			r := ts.do(t, "GET", "/v1/workers", nil)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if tt.want != "" && strings.TrimSpace(string(r.body)) != tt.want {
				t.Errorf("body %s, want %s", r.body, tt.want)
			}
			got := decode[api.WorkerList](t, r)
			if len(got.Workers) != len(tt.list) {
				t.Fatalf("workers %+v, want %+v", got.Workers, tt.list)
			}
			for i := range tt.list {
				if got.Workers[i].ID != tt.list[i].ID || len(got.Workers[i].Holdings) != len(tt.list[i].Holdings) {
					t.Errorf("worker %d = %+v, want %+v", i, got.Workers[i], tt.list[i])
				}
			}
		})
	}
}

func TestGetWorker(t *testing.T) {
	wk := &fakeWorkers{infos: map[string]api.WorkerInfo{
		"w1": {WorkerSummary: api.WorkerSummary{ID: "w1"}, MemAvailableMB: 900,
			Instances: []api.ProcessInfo{{Kind: "instance", Function: "fn", Version: 1, ID: "i-1", Pid: 7, PSS: 5 << 20, USS: 4 << 20}}},
		"host.example": {WorkerSummary: api.WorkerSummary{ID: "host.example"}},
	}}
	ts := newWorkersServer(t, wk)

	r := ts.do(t, "GET", "/v1/workers/w1", nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	info := decode[api.WorkerInfo](t, r)
	if info.ID != "w1" || info.MemAvailableMB != 900 || len(info.Instances) != 1 || info.Instances[0].PSS != 5<<20 {
		t.Errorf("info %+v", info)
	}
	// No processes of a kind is an empty list, as the spec says, never null.
	if !strings.Contains(string(r.body), `"templates":[]`) {
		t.Errorf("templates not an empty list: %s", r.body)
	}
	if r := ts.do(t, "GET", "/v1/workers/host.example", nil); r.status != http.StatusOK {
		t.Errorf("id with a dot: status %d: %s", r.status, r.body)
	}
	wantError(t, ts.do(t, "GET", "/v1/workers/nope", nil), http.StatusNotFound, api.CodeNotFound, `no worker "nope"`)
	wantError(t, ts.do(t, "POST", "/v1/workers/w1", nil), http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "GET")
}

func TestDropInstances(t *testing.T) {
	wk := &fakeWorkers{fns: map[string]int{"fn": 3}}
	ts := newWorkersServer(t, wk)
	tests := []struct {
		name    string
		query   string
		want    api.DropResult
		dropped string
	}{
		{"every version", "", api.DropResult{Instances: 3, Templates: 1, Workers: 2}, "fn 0 false"},
		{"one version", "?version=2", api.DropResult{Instances: 3, Templates: 1, Workers: 2}, "fn 2 false"},
		{"keep templates", "?version=3&keep_templates=true", api.DropResult{Instances: 3, Workers: 2}, "fn 3 true"},
		{"keep_templates=false", "?keep_templates=false", api.DropResult{Instances: 3, Templates: 1, Workers: 2}, "fn 0 false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.do(t, "DELETE", "/v1/functions/fn/instances"+tt.query, nil)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := decode[api.DropResult](t, r); got != tt.want {
				t.Errorf("result %+v, want %+v", got, tt.want)
			}
			wk.mu.Lock()
			defer wk.mu.Unlock()
			if last := wk.dropped[len(wk.dropped)-1]; last != tt.dropped {
				t.Errorf("backend asked %q, want %q", last, tt.dropped)
			}
		})
	}

	errTests := []struct {
		name, path string
		status     int
		code, msg  string
	}{
		{"unknown function", "/v1/functions/nope/instances", http.StatusNotFound, api.CodeNotFound, "function nope not found"},
		{"unknown version", "/v1/functions/fn/instances?version=9", http.StatusNotFound, api.CodeNotFound, "not found"},
		{"bad name", "/v1/functions/a%20b/instances", http.StatusBadRequest, api.CodeInvalid, "invalid function name"},
		{"bad version", "/v1/functions/fn/instances?version=x", http.StatusBadRequest, api.CodeInvalid, "invalid version"},
		{"version 0", "/v1/functions/fn/instances?version=0", http.StatusBadRequest, api.CodeInvalid, "invalid version"},
		{"bad keep_templates", "/v1/functions/fn/instances?keep_templates=maybe", http.StatusBadRequest, api.CodeInvalid, "keep_templates"},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, ts.do(t, "DELETE", tt.path, nil), tt.status, tt.code, tt.msg)
		})
	}
}

func TestEvictWorker(t *testing.T) {
	wk := &fakeWorkers{infos: map[string]api.WorkerInfo{"w1": {WorkerSummary: api.WorkerSummary{ID: "w1"}}}}
	ts := newWorkersServer(t, wk)
	for _, tt := range []struct {
		name, body string
		asked      api.EvictRequest
		want       api.EvictReport
	}{
		{"no body", "", api.EvictRequest{}, api.EvictReport{Worker: "w1", Reason: "evict request", GraceMS: 30000, Running: 2}},
		{"empty object", " {} \n", api.EvictRequest{}, api.EvictReport{Worker: "w1", Reason: "evict request", GraceMS: 30000, Running: 2}},
		{"grace and reason", `{"grace_ms": 5000, "reason": "spot reclaim"}`, api.EvictRequest{GraceMS: 5000, Reason: "spot reclaim"},
			api.EvictReport{Worker: "w1", Reason: "spot reclaim", GraceMS: 5000, Running: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.do(t, "POST", "/v1/workers/w1/evict", []byte(tt.body), "Content-Type", "application/json")
			if r.status != http.StatusAccepted {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := decode[api.EvictReport](t, r); got != tt.want {
				t.Errorf("report %+v, want %+v", got, tt.want)
			}
			wk.mu.Lock()
			defer wk.mu.Unlock()
			if last := wk.evicted[len(wk.evicted)-1]; last != tt.asked {
				t.Errorf("backend asked %+v, want %+v", last, tt.asked)
			}
		})
	}

	wk.mu.Lock()
	asked := len(wk.evicted)
	wk.mu.Unlock()
	for _, tt := range []struct {
		name, path, body string
		status           int
		code, msg        string
	}{
		{"bad JSON", "/v1/workers/w1/evict", `{"grace_ms":`, http.StatusBadRequest, api.CodeInvalid, "invalid evict request"},
		{"wrong type", "/v1/workers/w1/evict", `{"grace_ms": "30s"}`, http.StatusBadRequest, api.CodeInvalid, "grace_ms"},
		{"unknown field", "/v1/workers/w1/evict", `{"grace": 5}`, http.StatusBadRequest, api.CodeInvalid, `unknown field "grace"`},
		{"trailing data", "/v1/workers/w1/evict", `{} {}`, http.StatusBadRequest, api.CodeInvalid, "after the JSON object"},
		{"too large", "/v1/workers/w1/evict", `{"reason": "` + strings.Repeat("x", maxEvictBody) + `"}`, http.StatusBadRequest, api.CodeInvalid, "over 65536 bytes"},
		{"negative grace", "/v1/workers/w1/evict", `{"grace_ms": -1}`, http.StatusBadRequest, api.CodeInvalid, "invalid grace_ms -1"},
		{"worker not found", "/v1/workers/nope/evict", "", http.StatusNotFound, api.CodeNotFound, `no worker "nope"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, ts.do(t, "POST", tt.path, []byte(tt.body)), tt.status, tt.code, tt.msg)
		})
	}
	wk.mu.Lock()
	if len(wk.evicted) != asked {
		t.Errorf("a rejected request reached the backend: %+v", wk.evicted[asked:])
	}
	wk.mu.Unlock()
	wantError(t, ts.do(t, "GET", "/v1/workers/w1/evict", nil), http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "POST")
}

// Without a worker directory the routes answer 503, the rest of the API works.
func TestWorkerRoutesWithoutDirectory(t *testing.T) {
	ts := newWorkersServer(t, nil)
	ts.deploy(t, "fn")
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/workers"},
		{"GET", "/v1/workers/w1"},
		{"POST", "/v1/workers/w1/evict"},
		{"DELETE", "/v1/functions/fn/instances"},
	} {
		r := ts.do(t, rt.method, rt.path, nil)
		wantError(t, r, http.StatusServiceUnavailable, api.CodeUnavailable, "no worker directory")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: no Retry-After", rt.method, rt.path)
		}
	}
	if r := ts.do(t, "GET", "/v1/functions/fn", nil); r.status != http.StatusOK {
		t.Errorf("GET /v1/functions/fn: %d %s", r.status, r.body)
	}
}
