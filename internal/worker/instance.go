package worker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/runtimes"
)

// instance is one sandboxed process running a function version's code.
type instance struct {
	id       string
	ver      function.Version
	sb       *sandbox.Sandbox
	cl       *agentproto.Client
	initLogs []agentproto.LogRecord // printed during init; shown with the first call
	lastUsed time.Time
	spec     sandbox.Spec // what it runs in (without ExtraFiles); snapshots need its mounts
	lastCall string       // the call it served last (snapshot requests by call)
	tmpl     *fnTemplate  // the function template it was forked from; nil when it started on its own
	start    string       // how it started: function.StartWarm, StartCold, StartRestore
}

// alive reports whether the instance's process is still running.
func (in *instance) alive() bool {
	select {
	case <-in.sb.Done():
		return false
	default:
		return true
	}
}

// spawn starts a new instance of ver and initializes its code (the cold path).
// An *agentproto.InitError means the function's own code failed to load.
func (w *Worker) spawn(ctx context.Context, ver function.Version) (*instance, error) {
	codeDir, err := w.codeDir(ctx, ver)
	if err != nil {
		return nil, err
	}
	conn, child, err := agentproto.SocketPair(false)
	if err != nil {
		return nil, err
	}
	id := newInstanceID()
	spec := w.instanceSpec(ver, id, codeDir)
	spec.ExtraFiles = []*os.File{child}
	sb, err := w.sandboxes.Start(ctx, spec)
	_ = child.Close()
	if err != nil {
		_ = conn.Close()
		// Even an "invalid" sandbox spec is this worker's misconfiguration
		// (e.g. a missing interpreter), not the caller's mistake.
		return nil, fmt.Errorf("start sandbox for %s v%d: %v: %w", ver.Name, ver.Version, err, errdefs.ErrUnavailable)
	}
	spec.ExtraFiles = nil
	in := &instance{id: id, ver: ver, sb: sb, cl: agentproto.NewClient(conn), spec: spec}
	if err := w.initInstance(ctx, in); err != nil {
		w.destroy(in)
		return nil, err
	}
	w.metrics.instances.WithLabelValues("live").Inc()
	return in, nil
}

// instanceSpec is the sandbox of an instance of ver with id; the caller
// adds the agent's socket as ExtraFiles[0] (fd 3).
func (w *Worker) instanceSpec(ver function.Version, id, codeDir string) sandbox.Spec {
	return sandbox.Spec{
		ID:       id,
		UID:      ver.UID,
		GID:      ver.UID,
		Hostname: "torpor",
		Binds: append([]sandbox.Bind{
			{Source: codeDir, Target: "/var/task"},
			{Source: w.agentDir, Target: "/opt/torpor"},
		}, w.runtimeBinds...),
		// -I: the tenant's environment cannot change how Python starts; -S:
		// no site-packages (dependencies ship in the code package, as on
		// Lambda), which also saves ~40 ms per start.
		Argv:        []string{w.cfg.Python, "-I", "-S", "-c", runtimes.PythonBootstrap, "/opt/torpor"},
		Env:         instanceEnv(ver),
		Dir:         "/var/task",
		HostNetwork: w.cfg.HostNetwork,
		Limits: sandbox.Limits{
			MemoryMB:  ver.MemoryMB,
			CPUShares: cpuShares(ver.MemoryMB),
			Pids:      w.cfg.PidsLimit,
			TmpMB:     w.cfg.TmpMB,
			NoFile:    1024,
		},
	}
}

func (w *Worker) initInstance(ctx context.Context, in *instance) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.InitTimeout)
	defer cancel()
	if _, err := in.cl.Handshake(ctx); err != nil {
		return fmt.Errorf("agent of %s did not start: %w", in.ver.Name, w.exitCause(in, err))
	}
	_, err := in.cl.Init(ctx, agentproto.InitParams{
		Function: in.ver.Name, Version: in.ver.Version, Handler: in.ver.Handler, MemoryMB: in.ver.MemoryMB,
		Timeout: in.ver.Timeout(), ARN: in.ver.ARN(), LogGroup: "/aws/lambda/" + in.ver.Name, CodeDir: "/var/task",
	}, func(r agentproto.LogRecord) { in.initLogs = append(in.initLogs, r) })
	if err != nil {
		var ie *agentproto.InitError
		if errors.As(err, &ie) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("init of %s took longer than %s: %w", in.ver.Name, w.cfg.InitTimeout, err)
		}
		return fmt.Errorf("init of %s: %w", in.ver.Name, w.exitCause(in, err))
	}
	return nil
}

// exitCause explains an agent that went away: when the sandbox died, its exit
// status (OOM kill, signal, exit code) says more than the socket error.
func (w *Worker) exitCause(in *instance, err error) error {
	if ferr := w.deathError(in); ferr != nil {
		return fmt.Errorf("%s: %w", ferr.ErrorMessage, err)
	}
	return err
}

// deathError waits briefly for the instance's process to be gone and returns
// the Lambda-shaped error describing how it died, or nil if it is alive.
func (w *Worker) deathError(in *instance) *function.Error {
	select {
	case <-in.sb.Done():
	case <-time.After(2 * time.Second):
		return nil
	}
	st := in.sb.ExitStatus()
	switch {
	case st.OOMKilled:
		return &function.Error{ErrorType: "Runtime.OutOfMemory", ErrorMessage: fmt.Sprintf(
			"Runtime exited with error: signal: killed: the function exceeded its memory limit of %d MB (raise it with --memory)", in.ver.MemoryMB)}
	case st.Signal != 0:
		return &function.Error{ErrorType: "Runtime.ExitError", ErrorMessage: "Runtime exited with error: signal: " + unix.SignalName(st.Signal)}
	default:
		return &function.Error{ErrorType: "Runtime.ExitError", ErrorMessage: "Runtime exited with error: exit status " + strconv.Itoa(st.Code)}
	}
}

// destroy tears an instance down in the background.
func (w *Worker) destroy(in *instance) {
	_ = in.cl.Close()
	if in.tmpl != nil {
		w.tmpl.instanceGone(in.tmpl)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := in.sb.Destroy(ctx); err != nil {
			w.log.Warn("destroy instance", "instance", in.id, "fn", in.ver.Name, "err", err)
		}
	}()
}

// codeDir returns the directory holding ver's extracted code, extracting it
// on first use. Code is content-addressed, so versions with the same package
// share it.
func (w *Worker) codeDir(ctx context.Context, ver function.Version) (string, error) {
	dir := filepath.Join(w.cfg.Home, "code", ver.CodeDigest)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	_, err, _ := w.extract.Do(ver.CodeDigest, func() (any, error) {
		if _, err := os.Stat(dir); err == nil {
			return nil, nil
		}
		zip, err := w.reg.Code(ctx, ver.CodeDigest)
		if err != nil {
			return nil, err
		}
		return nil, w.extractZip(ctx, zip, dir)
	})
	if err != nil {
		return "", fmt.Errorf("code of %s v%d: %w", ver.Name, ver.Version, err)
	}
	return dir, nil
}

func instanceEnv(ver function.Version) []string {
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"LANG=C.UTF-8",
		"HOME=/tmp",
		"TZ=:UTC",
		"LAMBDA_TASK_ROOT=/var/task",
		"AWS_LAMBDA_FUNCTION_NAME=" + ver.Name,
		"AWS_LAMBDA_FUNCTION_VERSION=" + strconv.Itoa(ver.Version),
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=" + strconv.Itoa(ver.MemoryMB),
		"AWS_LAMBDA_LOG_GROUP_NAME=/aws/lambda/" + ver.Name,
		"TORPOR_AGENT_FD=3",
	}
	// A user's value replaces the default of the same name (the first
	// occurrence would win in the process).
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := ver.Env[k]; ok {
			env[i] = k + "=" + v
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ver.Env)) {
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
			env = append(env, k+"="+ver.Env[k])
		}
	}
	return env
}

// cpuShares gives CPU in proportion to memory, as Lambda does (1769 MB is one
// full vCPU), as a share rather than a cap so that idle CPU is never wasted.
func cpuShares(memoryMB int) int {
	return max(2, memoryMB*1024/1769)
}

func newInstanceID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "i-" + strings.ToLower(fmt.Sprintf("%x", b))
}
