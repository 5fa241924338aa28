package template_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/template"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/runtimes"
)

func TestMain(m *testing.M) {
	if sandbox.IsInit() {
		sandbox.InitMain()
	}
	os.Exit(m.Run())
}

const uidBase = 700_000_000

// stack starts a sandbox manager and a runtime template whose code cache
// holds one function, "fn", with the given source.
func stack(t testing.TB, src string) (*template.Runtime, template.FunctionSpec) {
	t.Helper()
	testenv.RequireRoot(t)
	ctx := testenv.Ctx(t)
	py, err := config.ResolvePython(ctx, testenv.Python(t))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(home, "agent")
	codeDir := filepath.Join(home, "code")
	for _, d := range []string{agentDir, filepath.Join(codeDir, "fn")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(agentDir, runtimes.PythonAgentName), runtimes.PythonAgent, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(py.Path, "-m", "py_compile", filepath.Join(agentDir, runtimes.PythonAgentName)).CombinedOutput(); err != nil {
		t.Fatalf("py_compile: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(codeDir, "fn", "app.py"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.NewManager(ctx, sandbox.Config{StateDir: filepath.Join(home, "sandbox"),
		CgroupName: "torpor-test-tmpl-" + filepath.Base(home)}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Close(cctx)
	})
	var binds []sandbox.Bind
	if !strings.HasPrefix(py.Prefix, "/usr") {
		binds = append(binds, sandbox.Bind{Source: py.Prefix, Target: py.Prefix})
	}
	errf, err := os.Create(filepath.Join(home, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(errf.Name())
			t.Logf("templates' stderr:\n%s", b)
		}
	})
	rt, err := template.StartRuntime(ctx, m, template.RuntimeConfig{ID: "rt-python", Python: py.Path,
		AgentDir: agentDir, CodeDir: codeDir, Binds: binds, IDs: sandbox.IDRange{First: uidBase, Count: 1000},
		Limits: sandbox.Limits{MemoryMB: 256, Pids: 64}, Stderr: errf}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt, template.FunctionSpec{ID: "t-fn", Code: "fn", UID: uidBase + 7, GID: uidBase + 7,
		Env: []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "GREETING=hi"}, TmpMB: 16, NoFile: 256,
		Limits: sandbox.Limits{MemoryMB: 128, Pids: 64}}
}

const probeSrc = `import os, random, socket
print("imported")
STATE = {"n": 0}
def handler(event, context):
    STATE["n"] += 1
    if event.get("write"):
        with open("/tmp/mine", "w") as f:
            f.write(event["write"])
    try:
        tmp = open("/tmp/mine").read()
    except OSError:
        tmp = None
    try:
        socket.create_connection(("10.0.0.1", 9), timeout=0.2)
        net = "reachable"
    except OSError as e:
        net = type(e).__name__
    import ctypes
    userns = "allowed" if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0 else "denied"
    return {"uid": os.getuid(), "pid": os.getpid(), "n": STATE["n"], "rand": random.random(),
            "tmp": tmp, "env": os.environ.get("GREETING"), "cwd": os.getcwd(),
            "tasks": sorted(os.listdir("/var/task")), "net": net, "userns": userns}
`

func invoke(t testing.TB, cl *agentproto.Client, event string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(testenv.Ctx(t), 10*time.Second)
	defer cancel()
	out, ferr, err := cl.Invoke(ctx, agentproto.InvokeParams{ID: "c", Payload: []byte(event), Deadline: time.Now().Add(10 * time.Second)}, nil)
	if err != nil || ferr != nil {
		t.Fatalf("invoke: %v %+v", err, ferr)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestForkLineage(t *testing.T) {
	rt, fs := stack(t, probeSrc)
	ctx := testenv.Ctx(t)
	fn, err := rt.ForkFunction(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	if fn.Hello.Role != "function-template" || fn.Hello.Pid != 1 {
		t.Fatalf("function template hello %+v", fn.Hello)
	}
	var initLog strings.Builder
	if _, err := fn.Client().Init(ctx, agentproto.InitParams{Function: "fn", Version: 1, Handler: "app.handler",
		MemoryMB: 128, Timeout: 10 * time.Second, CodeDir: "/var/task"}, func(r agentproto.LogRecord) { initLog.Write(r.Data) }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(initLog.String(), "imported") {
		t.Errorf("import output %q, want it captured as init log", initLog.String())
	}
	type inst struct {
		sb *sandbox.Sandbox
		cl *agentproto.Client
	}
	var insts []inst
	for i := range 3 {
		sb, cl, err := fn.Fork(ctx, "i-test-"+string(rune('a'+i)), sandbox.Limits{MemoryMB: 128, Pids: 32})
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst{sb, cl})
	}
	a := invoke(t, insts[0].cl, `{"write":"from-a"}`)
	b := invoke(t, insts[1].cl, `{}`)
	if a["uid"].(float64) != float64(fs.UID) || a["env"] != "hi" || a["cwd"] != "/var/task" {
		t.Errorf("instance identity %v", a)
	}
	if got := a["tasks"].([]any); len(got) != 1 || got[0] != "app.py" {
		t.Errorf("/var/task shows %v, want only the function's own code", got)
	}
	if a["pid"] == b["pid"] || a["pid"].(float64) == 1 {
		t.Errorf("instance pids %v %v: want distinct, not the template's", a["pid"], b["pid"])
	}
	if a["rand"] == b["rand"] {
		t.Errorf("forked instances drew the same random number %v: not reseeded", a["rand"])
	}
	if a["n"].(float64) != 1 || b["n"].(float64) != 1 {
		t.Errorf("state leaked between instances: %v %v", a["n"], b["n"])
	}
	if a["net"] == "reachable" || a["userns"] != "denied" {
		t.Errorf("sandbox too open: net %v, unshare(CLONE_NEWUSER) %v", a["net"], a["userns"])
	}
	// Each instance is in its own cgroup, with its own limit.
	if st, err := insts[0].sb.Stats(); err != nil || st.MemoryBytes == 0 {
		t.Errorf("instance cgroup stats %+v, %v", st, err)
	}
	// An instance that dies is reported with its status.
	if err := insts[2].sb.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-insts[2].sb.Done():
		if st := insts[2].sb.ExitStatus(); st.Signal != 9 {
			t.Errorf("killed instance status %+v", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("killed instance never reported")
	}
	// The template keeps forking; closing it takes its instances along.
	if err := fn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, in := range insts[:2] {
		select {
		case <-in.sb.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("instance outlived its template")
		}
		_ = in.sb.Destroy(ctx)
	}
}

// BenchmarkFork measures the fork paths without HTTP: a warm start (fork
// an instance from the function template, call it, stop it), on request or
// from a child forked in advance, and a cold one (fork a function template from the runtime template, import
// the code, fork an instance, call it, stop both).
func BenchmarkFork(b *testing.B) {
	rt, fs := stack(b, "def handler(e, c):\n    return {}\n")
	ctx := testenv.Ctx(b)
	initFn := func(f *template.Function) {
		if _, err := f.Client().Init(ctx, agentproto.InitParams{Function: "fn", Version: 1, Handler: "app.handler",
			MemoryMB: 128, Timeout: 10 * time.Second, CodeDir: "/var/task"}, nil); err != nil {
			b.Fatal(err)
		}
	}
	lim := sandbox.Limits{MemoryMB: 128, Pids: 32}
	// warm: back to back, every fork made on request; warm-idle: 20 ms
	// between calls, so the template has its next child forked in advance.
	for _, bc := range []struct {
		name string
		idle time.Duration
	}{{"warm", 0}, {"warm-idle", 20 * time.Millisecond}} {
		b.Run(bc.name, func(b *testing.B) {
			fn, err := rt.ForkFunction(ctx, fs)
			if err != nil {
				b.Fatal(err)
			}
			initFn(fn)
			defer fn.Close(ctx)
			b.ResetTimer()
			for i := range b.N {
				sb, cl, err := fn.Fork(ctx, fmt.Sprintf("i-bench-%s-%d", bc.name, i), lim)
				if err != nil {
					b.Fatal(err)
				}
				invoke(b, cl, "{}")
				b.StopTimer()
				cl.Close()
				_ = sb.Destroy(ctx)
				time.Sleep(bc.idle)
				b.StartTimer()
			}
		})
		fs.ID += "x"
	}
	b.Run("cold", func(b *testing.B) {
		for i := range b.N {
			fs.ID = fmt.Sprintf("t-bench-%d", i)
			fn, err := rt.ForkFunction(ctx, fs)
			if err != nil {
				b.Fatal(err)
			}
			initFn(fn)
			sb, cl, err := fn.Fork(ctx, fmt.Sprintf("i-bench-c%d", i), lim)
			if err != nil {
				b.Fatal(err)
			}
			invoke(b, cl, "{}")
			b.StopTimer()
			cl.Close()
			_ = sb.Destroy(ctx)
			_ = fn.Close(ctx)
			b.StartTimer()
		}
	})
}
