package app_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/internal/worker"
)

// templateNode is a worker without snapshots whose runtime template is up.
func templateNode(t *testing.T, opts ...nodeOption) node {
	t.Helper()
	requireRoot(t)
	testenv.Python(t)
	n := newNode(t, testenv.Bus(t), nil, nil, "w1", opts...)
	n.waitRuntimeTemplate(t)
	return n
}

// waitRuntimeTemplate waits until the node's runtime template is up (until
// then, instances start standalone).
func (n node) waitRuntimeTemplate(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "runtime template up", func() bool {
		return len(n.w.Info().Templates) > 0
	})
}

func (n node) call(t *testing.T, fn, event string) function.InvokeResult {
	t.Helper()
	res, err := n.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: fn, Payload: []byte(event)})
	if err != nil {
		t.Fatalf("call %s: %v", fn, err)
	}
	if res.Err != nil {
		t.Fatalf("call %s: %s: %s", fn, res.Err.ErrorType, res.Err.ErrorMessage)
	}
	return res
}

// TestStartPaths walks one function through the stack: its deploy makes
// the function template (cold) and leaves an instance (hot); with the
// instances dropped a call forks one (warm); with the template dropped
// too, a call makes a new template (cold). Parallel calls fork one
// instance each from the one template.
func TestStartPaths(t *testing.T) {
	n := templateNode(t)
	n.deploy(t, "paths", "import os, random\ndef handler(e, c):\n    return {'pid': os.getpid(), 'r': random.random(), 'uid': os.getuid()}\n", 128)
	if got := n.call(t, "paths", "{}").Start; got != function.StartHot {
		t.Errorf("first call after deploy: %s, want hot (the deploy's instance)", got)
	}
	n.w.Drop("paths", 0, true)
	if got := n.call(t, "paths", "{}").Start; got != function.StartWarm {
		t.Errorf("call with only the template left: %s, want warm", got)
	}
	if got := n.call(t, "paths", "{}").Start; got != function.StartHot {
		t.Errorf("next call: %s, want hot", got)
	}
	if d := n.w.Drop("paths", 0, false); d.Templates != 1 || d.Instances != 1 {
		t.Errorf("drop: %+v, want 1 template and 1 instance", d)
	}
	if got := n.call(t, "paths", "{}").Start; got != function.StartCold {
		t.Errorf("call with nothing left: %s, want cold", got)
	}

	// Four at once: one hot, three forked; all different processes with
	// their own random numbers.
	const par = 4
	var (
		mu     sync.Mutex
		starts = map[string]int{}
		pids   = map[float64]bool{}
		rands  = map[float64]bool{}
		wg     sync.WaitGroup
	)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := n.call(t, "paths", `{"sleep": 1}`)
			var out struct{ Pid, R, UID float64 }
			if err := json.Unmarshal(res.Payload, &out); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			starts[res.Start]++
			pids[out.Pid], rands[out.R] = true, true
			mu.Unlock()
		}()
	}
	wg.Wait()
	if starts[function.StartCold] > 0 || starts[function.StartRestore] > 0 {
		t.Errorf("parallel calls started %v: want only hot and warm", starts)
	}
	info := n.w.Info()
	var fnTemplates int
	for _, p := range info.Templates {
		if p.Kind == "function-template" {
			fnTemplates++
			if p.USS <= 0 || p.PSS <= 0 {
				t.Errorf("template memory not measured: %+v", p)
			}
		}
	}
	if fnTemplates != 1 {
		t.Errorf("%d function templates, want 1: %+v", fnTemplates, info.Templates)
	}
	t.Logf("parallel starts %v, %d distinct pids, %d distinct random numbers", starts, len(pids), len(rands))
}

// TestInheritedSocketFallsBack: a function whose code opens a socket at
// import cannot be forked (every instance would share the socket); the
// worker notices at the first fork and starts its instances on their own.
func TestInheritedSocketFallsBack(t *testing.T) {
	n := templateNode(t)
	n.deploy(t, "sock", "import socket\nS = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nS.bind(('127.0.0.1', 0))\n"+
		"def handler(e, c):\n    return {'port': S.getsockname()[1]}\n", 128)
	n.w.Drop("sock", 0, false)
	for i := range 3 {
		res := n.call(t, "sock", "{}")
		if i == 0 && res.Start != function.StartCold {
			t.Errorf("first call %s, want cold", res.Start)
		}
	}
	for _, h := range n.w.Summary().Holdings {
		if h.Function == "sock" && h.Template {
			t.Errorf("a template of a function holding a socket is kept: %+v", h)
		}
	}
}

// TestReclaimSqueeze deploys functions that each hold 40 MB from their
// import into sandboxes capped at 512 MB together — twice what fits. The
// reclaimer must stop idle instances and unused templates in time: no call
// fails and the kernel's OOM killer never runs.
func TestReclaimSqueeze(t *testing.T) {
	n := templateNode(t, func(w *worker.Config, s *sandbox.Config) {
		s.TotalMemoryMB = 512
		w.ReclaimLowMB, w.ReclaimHighMB = 160, 240
	})
	oomBefore := vmstat(t, "oom_kill")
	const fns = 24
	code := "BLOB = bytearray(40 << 20)\nfor i in range(0, len(BLOB), 4096):\n    BLOB[i] = 1\n" +
		"def handler(e, c):\n    return {'n': len(BLOB)}\n"
	for i := range fns {
		name := fmt.Sprintf("squeeze-%02d", i)
		n.deploy(t, name, code, 128)
		for range 2 {
			if res := n.call(t, name, "{}"); !strings.Contains(string(res.Payload), strconv.Itoa(40<<20)) {
				t.Fatalf("%s: %s", name, res.Payload)
			}
		}
	}
	// The early functions were reclaimed; calling them again works.
	for i := range 4 {
		n.call(t, fmt.Sprintf("squeeze-%02d", i), "{}")
	}
	info := n.w.Info()
	var templates int
	for _, p := range info.Templates {
		if p.Kind == "function-template" {
			templates++
		}
	}
	if templates >= fns {
		t.Errorf("%d function templates kept for %d functions in 512 MB: nothing was reclaimed", templates, fns)
	}
	if after := vmstat(t, "oom_kill"); after != oomBefore {
		t.Errorf("the kernel OOM-killed %d processes during the test", after-oomBefore)
	}
	t.Logf("%d of %d function templates kept; %d MB available below the cap", templates, fns, info.MemAvailableMB)
}

// vmstat reads a counter from /proc/vmstat.
func vmstat(t *testing.T, key string) int64 {
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/vmstat", key)
	return 0
}

// TestManyForksOfOneTemplate: 64 calls at once to one function fork 64
// instances from its template. What each child touches before it is moved
// into its own cgroup stays charged to the template's, so the template's
// limit must grow with them: none of the calls may fail and the template
// must survive.
func TestManyForksOfOneTemplate(t *testing.T) {
	n := templateNode(t)
	n.deploy(t, "many", "import time\ndef handler(e, c):\n    time.sleep(0.3)\n    return {}\n", 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); n.call(t, "many", "{}") }()
	}
	wg.Wait()
	var templates int
	for _, p := range n.w.Info().Templates {
		if p.Kind == "function-template" && p.Function == "many" {
			templates++
		}
	}
	if templates != 1 {
		t.Errorf("%d templates of the function after the burst, want the one it started with", templates)
	}
}

// TestSnapshotOfForkedInstanceRefused: a forked instance shares its
// template's PID namespace and cannot be checkpointed alone; asking for it
// by call is refused with the reason and what to do, and a snapshot of the
// function (a standalone instance) still works.
func TestSnapshotOfForkedInstanceRefused(t *testing.T) {
	n := newCluster(t, nil).node(t, "w1")
	n.waitRuntimeTemplate(t)
	n.deploy(t, "forked", "def handler(e, c):\n    return 1\n", 128)
	n.w.Drop("forked", 0, true)
	res := n.call(t, "forked", "{}")
	if res.Start != function.StartWarm {
		t.Fatalf("call started %s, want warm", res.Start)
	}
	_, err := n.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "forked", Call: res.CallID})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "forked from its function template") {
		t.Fatalf("snapshot of a forked instance's call: %v", err)
	}
	if _, err := n.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "forked"}); err != nil {
		t.Fatalf("snapshot of the function: %v", err)
	}
}

// TestTemplatesDie: a function template that dies (killed, OOM) is replaced
// on the next start, and a runtime template that dies is restarted — while
// it is down instances start standalone. No call fails either way.
func TestTemplatesDie(t *testing.T) {
	n := templateNode(t)
	n.deploy(t, "phoenix", "def handler(e, c):\n    return 1\n", 128)
	n.w.Drop("phoenix", 0, true)
	if got := n.call(t, "phoenix", "{}").Start; got != function.StartWarm {
		t.Fatalf("call started %s, want warm", got)
	}
	pid := func(kind string) int {
		for _, p := range n.w.Info().Templates {
			if p.Kind == kind {
				return p.Pid
			}
		}
		return 0
	}
	// The function template dies: the next fork notices and makes a new one.
	if err := syscall.Kill(pid("function-template"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.w.Drop("phoenix", 0, true)
	if got := n.call(t, "phoenix", "{}").Start; got != function.StartCold {
		t.Errorf("call after its template died started %s, want cold (a new template)", got)
	}
	// The runtime template dies: calls keep working, and it comes back.
	old := pid("runtime-template")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		n.w.Drop("phoenix", 0, false)
		n.call(t, "phoenix", "{}")
	}
	testenv.Eventually(t, 30*time.Second, "runtime template restarted", func() bool {
		p := pid("runtime-template")
		return p != 0 && p != old
	})
	n.w.Drop("phoenix", 0, false)
	if got := n.call(t, "phoenix", "{}").Start; got != function.StartCold {
		t.Errorf("call after the restart started %s, want cold", got)
	}
	if got := n.call(t, "phoenix", `{"again": 1}`).Start; got != function.StartHot {
		t.Errorf("next call started %s, want hot", got)
	}
}
