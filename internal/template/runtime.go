// Package template is SEUSS's snapshot stack built from fork(2): a runtime
// template per runtime (an initialised, warmed interpreter parked as a fork
// server), a function template per function version (forked from it; it
// enters the function's sandbox, then imports the code, then only forks),
// and instances forked from the function template. See docs/templates.md.
//
// This package starts and drives the template processes; which templates
// to keep, when to reclaim them and where calls go is the worker's job.
package template

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/runtimes"
)

// RuntimeConfig describes a runtime template.
type RuntimeConfig struct {
	ID       string // sandbox id, e.g. "rt-python"
	Python   string // absolute interpreter path
	AgentDir string // host dir holding the agent, bound at /opt/torpor
	// CodeDir is the worker's code cache (one subdirectory per code
	// digest), bound read-only at /var/task: each function template binds
	// its own subdirectory over it.
	CodeDir string
	Binds   []sandbox.Bind // e.g. the interpreter's prefix when outside /usr
	IDs     sandbox.IDRange
	Limits  sandbox.Limits
	// HostNetwork gives function templates the host's network namespace
	// (as Spec.HostNetwork does for instances).
	HostNetwork bool
	// Stderr receives the templates' own diagnostics (nil: discarded).
	Stderr *os.File
	// Spares is how many function sandboxes the runtime template keeps
	// made in advance (namespaces created, loopback up), so that a cold
	// start does not wait for them; default 2.
	Spares int
}

// Runtime is a running runtime template.
type Runtime struct {
	cfg     RuntimeConfig
	m       *sandbox.Manager
	log     *slog.Logger
	sb      *sandbox.Sandbox
	cl      *agentproto.Client
	exits   *exitTable // its children (function templates), by pid in its namespace
	seccomp string     // hex of the filter function templates install
	Hello   agentproto.Hello
}

// StartRuntime starts a runtime template and waits until it has warmed up.
func StartRuntime(ctx context.Context, m *sandbox.Manager, cfg RuntimeConfig, log *slog.Logger) (*Runtime, error) {
	prog, err := sandbox.SeccompProgram()
	if err != nil {
		return nil, fmt.Errorf("runtime template: %w", err)
	}
	if cfg.Spares == 0 {
		cfg.Spares = 2
	}
	conn, child, err := agentproto.SocketPair(true)
	if err != nil {
		return nil, fmt.Errorf("runtime template: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		conn.Close()
		child.Close()
		return nil, fmt.Errorf("runtime template: status pipe: %w", err)
	}
	ownNet := "1"
	if cfg.HostNetwork {
		ownNet = "0"
	}
	spec := sandbox.Spec{
		ID:       cfg.ID,
		Template: &sandbox.TemplateSpec{IDs: cfg.IDs},
		Binds: append([]sandbox.Bind{
			{Source: cfg.CodeDir, Target: "/var/task"},
			{Source: cfg.AgentDir, Target: "/opt/torpor"},
		}, cfg.Binds...),
		Argv: []string{cfg.Python, "-I", "-S", "-c", runtimes.PythonBootstrap, "/opt/torpor"},
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp",
			"TORPOR_AGENT_FD=3", "TORPOR_STATUS_FD=4", "TORPOR_ROLE=runtime-template",
			"TORPOR_OWN_NETWORK=" + ownNet, "TORPOR_SPARES=" + strconv.Itoa(cfg.Spares)},
		Dir:         "/",
		ExtraFiles:  []*os.File{child, statusW},
		Limits:      cfg.Limits,
		HostNetwork: cfg.HostNetwork,
		Stderr:      cfg.Stderr,
	}
	sb, err := m.Start(ctx, spec)
	child.Close()
	statusW.Close()
	if err != nil {
		conn.Close()
		statusR.Close()
		return nil, fmt.Errorf("start runtime template: %w", err)
	}
	r := &Runtime{cfg: cfg, m: m, log: log.With("template", cfg.ID), sb: sb, cl: agentproto.NewClient(conn),
		exits: newExitTable(), seccomp: hex.EncodeToString(prog)}
	go r.exits.read(statusR)
	if r.Hello, err = r.cl.Handshake(ctx); err != nil {
		r.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("runtime template did not start: %w", err)
	}
	if r.Hello.Role != "runtime-template" {
		r.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("runtime template: agent answered as %q: an agent from another torpor build?", r.Hello.Role)
	}
	r.log.Info("runtime template ready", "runtime", r.Hello.Runtime, "pid", sb.Pid(), "warm_ms", r.Hello.WarmMS)
	return r, nil
}

// Pid is the runtime template's host pid.
func (r *Runtime) Pid() int { return r.sb.Pid() }

// Sandbox is the runtime template's process and cgroup.
func (r *Runtime) Sandbox() *sandbox.Sandbox { return r.sb }

// Done is closed when the runtime template has exited.
func (r *Runtime) Done() <-chan struct{} { return r.sb.Done() }

// Close stops the runtime template and with it every function template and
// instance forked from it (they live in PID namespaces below its own).
func (r *Runtime) Close(ctx context.Context) error {
	_ = r.cl.Close()
	err := r.sb.Destroy(ctx)
	r.exits.closeAll()
	return err
}

// FunctionSpec is the sandbox of a function template and the instances
// forked from it.
type FunctionSpec struct {
	ID       string // sandbox (cgroup) id of the template
	Code     string // the code's directory name in RuntimeConfig.CodeDir
	UID, GID int    // in RuntimeConfig.IDs
	Env      []string
	TmpMB    int
	NoFile   int
	NProc    int
	Limits   sandbox.Limits // the template's own cgroup
}

// forkConfig is the function template's sandbox as the agent reads it.
type forkConfig struct {
	UID        int      `json:"uid"`
	GID        int      `json:"gid"`
	Code       string   `json:"code"`
	Env        []string `json:"env"`
	TmpMB      int      `json:"tmp_mb"`
	NoFile     int      `json:"nofile"`
	NProc      int      `json:"nproc,omitempty"`
	OwnNetwork bool     `json:"own_network"`
	Seccomp    string   `json:"seccomp"` // hex of struct sock_filter[]
}

// ForkFunction forks a function template: a child of the runtime template
// that builds fs's sandbox around itself and says hello. The caller then
// sends it init (Function.Client), which imports the code.
func (r *Runtime) ForkFunction(ctx context.Context, fs FunctionSpec) (*Function, error) {
	if fs.UID < r.cfg.IDs.First || fs.UID >= r.cfg.IDs.First+r.cfg.IDs.Count || fs.GID != fs.UID {
		return nil, fmt.Errorf("function template %s: uid %d outside the runtime template's range %+v", fs.ID, fs.UID, r.cfg.IDs)
	}
	conn, child, err := agentproto.SocketPair(true)
	if err != nil {
		return nil, fmt.Errorf("function template %s: %w", fs.ID, err)
	}
	defer child.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("function template %s: status pipe: %w", fs.ID, err)
	}
	defer statusW.Close()
	cfg := forkConfig{UID: fs.UID, GID: fs.GID, Code: fs.Code, Env: fs.Env, TmpMB: fs.TmpMB, NoFile: fs.NoFile,
		NProc: fs.NProc, OwnNetwork: !r.cfg.HostNetwork, Seccomp: r.seccomp}
	nsPid, err := r.cl.Fork(ctx, agentproto.TypeForkTemplate, cfg, child, statusW)
	child.Close()
	statusW.Close()
	if err != nil {
		conn.Close()
		statusR.Close()
		return nil, fmt.Errorf("fork function template %s: %w", fs.ID, err)
	}
	f := &Function{spec: fs, exits: newExitTable(), log: r.log.With("function_template", fs.ID)}
	go f.exits.read(statusR)
	cl, hello, err := agentproto.HandshakeForked(ctx, conn)
	if err != nil {
		conn.Close()
		r.exits.forget(nsPid)
		return nil, fmt.Errorf("function template %s: %w", fs.ID, err)
	}
	f.cl, f.Hello = cl, hello
	sb, report, err := r.m.Adopt(ctx, fs.ID, hello.HostPid, fs.Limits)
	if err != nil {
		cl.Close()
		_ = unix.Kill(hello.HostPid, unix.SIGKILL) // its exit is reported to r.exits and dropped
		r.exits.forget(nsPid)
		return nil, fmt.Errorf("function template %s: %w", fs.ID, err)
	}
	f.sb = sb
	r.exits.bind(nsPid, func(ws syscall.WaitStatus) {
		report(ws)
		f.exits.closeAll() // its instances died with it (pid 1 of their namespace)
	})
	if _, err := cl.Started(ctx); err != nil {
		_ = f.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("function template %s: %w", fs.ID, err)
	}
	return f, nil
}

// exitTable maps a template's children (pids in its namespace) to whoever
// wants their exit status, from the lines the template writes on its
// status pipe: "PID STATUS\n".
type exitTable struct {
	mu     sync.Mutex
	wait   map[int]func(syscall.WaitStatus)
	early  map[int]syscall.WaitStatus // exited before bind
	closed bool
}

func newExitTable() *exitTable {
	return &exitTable{wait: map[int]func(syscall.WaitStatus){}, early: map[int]syscall.WaitStatus{}}
}

// bind registers fn for pid's exit (at once if it already exited).
func (t *exitTable) bind(pid int, fn func(syscall.WaitStatus)) {
	t.mu.Lock()
	if ws, ok := t.early[pid]; ok || t.closed {
		delete(t.early, pid)
		t.mu.Unlock()
		if !ok {
			ws = killedStatus
		}
		fn(ws)
		return
	}
	t.wait[pid] = fn
	t.mu.Unlock()
}

// forget drops pid (a child that was never adopted).
func (t *exitTable) forget(pid int) {
	t.mu.Lock()
	delete(t.wait, pid)
	delete(t.early, pid)
	t.mu.Unlock()
}

// killedStatus is the wait status of a process killed by SIGKILL.
const killedStatus = syscall.WaitStatus(syscall.SIGKILL)

func (t *exitTable) exited(pid int, ws syscall.WaitStatus) {
	t.mu.Lock()
	fn, ok := t.wait[pid]
	if ok {
		delete(t.wait, pid)
	} else if !t.closed && len(t.early) < 4096 {
		t.early[pid] = ws // an orphan's exit, or one that beat bind
	}
	t.mu.Unlock()
	if ok {
		fn(ws)
	}
}

// closeAll reports every child still waited for as killed: the template is
// gone, and its children with it.
func (t *exitTable) closeAll() {
	t.mu.Lock()
	fns := t.wait
	t.wait, t.early, t.closed = map[int]func(syscall.WaitStatus){}, map[int]syscall.WaitStatus{}, true
	t.mu.Unlock()
	for _, fn := range fns {
		fn(killedStatus)
	}
}

// read consumes a status pipe until the template exits (EOF).
func (t *exitTable) read(r *os.File) {
	defer r.Close()
	defer t.closeAll()
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 4096)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			var pid, st int
			if _, serr := fmt.Sscanf(string(buf[:i]), "%d %d", &pid, &st); serr == nil {
				t.exited(pid, syscall.WaitStatus(st))
			}
			buf = buf[i+1:]
		}
		if err != nil {
			return
		}
	}
}
