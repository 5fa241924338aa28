package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/function"
)

// fakePlatform is the part of torpor's HTTP API the fast-start benchmarks
// use, with a toy worker: a call takes an idle instance (hot), else forks
// one from the function's template (warm), else makes the template first
// (cold); a deploy leaves a template, as validation may.
type fakePlatform struct {
	t          *testing.T
	token      string
	noDrop     bool // an older torpor: no DELETE .../instances route
	maxCached  int  // the worker keeps at most this many functions; 0: no limit
	failPrefix string
	sleep      time.Duration // of functions whose code sleeps

	mu      sync.Mutex
	version int
	fns     map[string]*fakeFn
	order   []string // functions by last use, oldest first
	drops   int
	deletes int
}

type fakeFn struct {
	version  int
	code     string
	template bool
	idle     int
}

func newFakePlatform(t *testing.T, f *fakePlatform) string {
	f.t, f.fns = t, map[string]*fakeFn{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

func (f *fakePlatform) names(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.fns {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// touchLocked marks name used and evicts the least recently used
// functions beyond maxCached.
func (f *fakePlatform) touchLocked(name string) {
	for i, n := range f.order {
		if n == name {
			f.order = append(f.order[:i], f.order[i+1:]...)
			break
		}
	}
	f.order = append(f.order, name)
	for f.maxCached > 0 && len(f.order) > f.maxCached {
		if fn := f.fns[f.order[0]]; fn != nil {
			fn.template, fn.idle = false, 0
		}
		f.order = f.order[1:]
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakePlatform) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.token != "" && r.URL.Path != "/healthz" && r.Header.Get("Authorization") != "Bearer "+f.token {
		writeJSON(w, http.StatusUnauthorized, api.Error{Message: "missing or invalid API token", Code: api.CodeUnauthorized})
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	notFound := func(what string) {
		writeJSON(w, http.StatusNotFound, api.Error{Message: what, Code: api.CodeNotFound})
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/healthz":
		w.Write([]byte(`{"status":"ok"}`))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/functions":
		f.mu.Lock()
		var l api.FunctionList
		for n, fn := range f.fns {
			l.Functions = append(l.Functions, function.Version{Spec: function.Spec{Name: n}, Version: fn.version})
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, l)
	case len(parts) == 3 && parts[1] == "functions" && r.Method == http.MethodPut:
		var req api.DeployRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			f.t.Errorf("deploy body: %v", err)
		}
		if req.MemoryMB != nopMemoryMB || req.Handler != "app.handler" {
			f.t.Errorf("deployed %+v", req.Spec)
		}
		f.mu.Lock()
		f.version++
		f.fns[parts[2]] = &fakeFn{version: f.version, code: unzipOne(f.t, req.CodeZip, "app.py"), template: true}
		f.touchLocked(parts[2])
		v := f.version
		f.mu.Unlock()
		writeJSON(w, http.StatusCreated, function.Version{Spec: req.Spec, Version: v})
	case len(parts) == 3 && parts[1] == "functions" && r.Method == http.MethodDelete:
		f.mu.Lock()
		_, ok := f.fns[parts[2]]
		delete(f.fns, parts[2])
		f.deletes++
		f.mu.Unlock()
		if !ok {
			notFound("function " + parts[2] + " not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case len(parts) == 4 && parts[3] == "instances" && r.Method == http.MethodDelete && !f.noDrop:
		f.mu.Lock()
		defer f.mu.Unlock()
		fn := f.fns[parts[2]]
		if fn == nil {
			notFound("function " + parts[2] + " not found")
			return
		}
		f.drops++
		res := api.DropResult{Instances: fn.idle, Workers: 1}
		fn.idle = 0
		if r.URL.Query().Get("keep_templates") != "true" && fn.template {
			fn.template, res.Templates = false, 1
		}
		writeJSON(w, http.StatusOK, res)
	case len(parts) == 4 && parts[3] == "invoke" && r.Method == http.MethodPost:
		f.invoke(w, parts[2])
	case r.Method == http.MethodGet && r.URL.Path == "/v1/workers":
		writeJSON(w, http.StatusOK, api.WorkerList{Workers: []api.WorkerSummary{{ID: "w1"}}})
	case r.Method == http.MethodGet && r.URL.Path == "/v1/workers/w1":
		writeJSON(w, http.StatusOK, f.info())
	default:
		notFound("no route for " + r.Method + " " + r.URL.Path + ": see the API reference")
	}
}

func (f *fakePlatform) invoke(w http.ResponseWriter, name string) {
	f.mu.Lock()
	fn := f.fns[name]
	if fn == nil {
		f.mu.Unlock()
		writeJSON(w, http.StatusNotFound, api.Error{Message: "function " + name + " not found", Code: api.CodeNotFound})
		return
	}
	start, dur := "hot", 0.05
	switch {
	case fn.idle > 0:
		fn.idle--
	case fn.template:
		start, dur = "warm", 1.5
	default:
		start, dur, fn.template = "cold", 4.5, true
	}
	f.touchLocked(name)
	sleeps := strings.Contains(fn.code, "sleep")
	f.mu.Unlock()
	if f.failPrefix != "" && strings.HasPrefix(name, f.failPrefix) {
		writeJSON(w, http.StatusInternalServerError, api.Error{Message: "instance crashed", Code: api.CodeInternal})
		return
	}
	if sleeps {
		time.Sleep(f.sleep)
	}
	f.mu.Lock()
	if f.fns[name] == fn {
		fn.idle++
	}
	f.mu.Unlock()
	w.Header().Set("X-Torpor-Start", start)
	w.Header().Set("Server-Timing", fmt.Sprintf("start;dur=%.3f, handler;dur=0.100", dur))
	w.Write([]byte("{}"))
}

// info is GET /v1/workers/w1: a runtime template, and a template and the
// idle instances of each function, with made-up memory.
func (f *fakePlatform) info() api.WorkerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	info := api.WorkerInfo{WorkerSummary: api.WorkerSummary{ID: "w1"}, MemAvailableMB: 20000, LowWatermarkMB: 500, HighWatermarkMB: 1000}
	info.Templates = append(info.Templates, api.ProcessInfo{Kind: kindRuntimeTemplate, Runtime: "python3", ID: "rt", Pid: 10, RSS: 12 << 20, PSS: 6 << 20, USS: 5 << 20})
	pid := 100
	for _, n := range f.order {
		fn := f.fns[n]
		if fn == nil {
			continue
		}
		if fn.template {
			pid++
			info.Templates = append(info.Templates, api.ProcessInfo{Kind: kindFunctionTemplate, Function: n, Version: fn.version, ID: n + "-t", Pid: pid, RSS: 12 << 20, PSS: 3 << 19, USS: 800 << 10})
		}
		for i := 0; i < fn.idle; i++ {
			pid++
			info.Instances = append(info.Instances, api.ProcessInfo{Kind: kindInstance, Function: n, Version: fn.version, ID: n + "-i", Pid: pid, State: "idle", RSS: 12 << 20, PSS: 1 << 20, USS: 600 << 10})
		}
	}
	return info
}
