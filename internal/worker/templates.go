package worker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/template"
)

// The worker's SEUSS stack (docs/templates.md): one runtime template, kept
// running (restarted if it dies), and a function template per function
// version, created on the version's first start and kept until the reaper
// or the reclaimer stops it. Instances forked from a function template are
// ordinary instances to the rest of the worker (hot pool, budget, calls);
// only how they start and stop differs.

// forkChargeMB is what a forked instance leaves charged to its template's
// cgroup until it exits: the pages it touches before the worker has moved
// it into a cgroup of its own (1.2 MB measured for a NOP function). The
// template's memory limit grows by this much per live instance.
const forkChargeMB = 2

// errNoTemplate means the fork path cannot serve a start (no runtime
// template yet, or the function cannot be forked): start the instance on
// its own instead.
var errNoTemplate = errors.New("no template")

// templateIDs are the uids function templates may switch to: those the
// registry hands out.
var templateIDs = sandbox.IDRange{First: registry.UIDBase, Count: 1 << 24}

type templates struct {
	w *Worker

	mu     sync.Mutex
	rt     *template.Runtime // nil while (re)starting or when unavailable
	fns    map[string]*fnTemplate
	noFork map[string]string // pool key → why its instances are started one by one
}

// fnTemplate is one function version's template, or its creation in
// progress (ready not yet closed).
type fnTemplate struct {
	key      string
	ver      function.Version
	ready    chan struct{} // closed once f or err is set
	f        *template.Function
	err      error
	initLogs []agentproto.LogRecord // what the import printed: shown with the first call
	created  time.Time
	// Guarded by templates.mu.
	lastUsed time.Time
	live     int  // instances forked from it that are still alive
	gone     bool // stopped, or being stopped
	limitMB  int  // its cgroup's memory limit (raised with live)
}

func newTemplates(w *Worker) *templates {
	return &templates{w: w, fns: map[string]*fnTemplate{}, noFork: map[string]string{}}
}

// run keeps the runtime template up until ctx ends, restarting it (with
// backoff) when it dies; its function templates die with it.
func (t *templates) run(ctx context.Context) {
	w := t.w
	backoff := time.Second
	for ctx.Err() == nil {
		rt, err := template.StartRuntime(ctx, w.sandboxes, template.RuntimeConfig{
			ID: "rt-python", Python: w.cfg.Python, AgentDir: w.agentDir, CodeDir: filepath.Join(w.cfg.Home, "code"),
			Binds: w.runtimeBinds, IDs: templateIDs, HostNetwork: w.cfg.HostNetwork,
			// No memory limit of its own: it runs only our code, and what
			// its children touch before they are moved into their own
			// cgroups (above all the kernel memory of their namespaces,
			// ~3 MB a function template) stays charged here.
			Limits: sandbox.Limits{Pids: 64},
		}, w.log)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("runtime template unavailable: instances start one by one (cold) until it is back",
				"err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		t.mu.Lock()
		t.rt = rt
		t.mu.Unlock()
		select {
		case <-rt.Done():
			w.log.Warn("runtime template exited; restarting it", "status", fmt.Sprintf("%+v", rt.Sandbox().ExitStatus()))
		case <-ctx.Done():
		}
		t.mu.Lock()
		t.rt = nil
		dead := t.fns
		t.fns = map[string]*fnTemplate{}
		t.mu.Unlock()
		for _, ft := range dead {
			t.stop(ft)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_ = rt.Close(cctx)
		cancel()
	}
}

// get returns ver's function template, creating it (created = true) when
// there is none. Concurrent callers share one creation.
func (t *templates) get(ctx context.Context, ver function.Version) (ft *fnTemplate, created bool, err error) {
	key := poolKey(ver.Name, ver.Version)
	for {
		t.mu.Lock()
		if why, ok := t.noFork[key]; ok {
			t.mu.Unlock()
			return nil, false, fmt.Errorf("%w: %s", errNoTemplate, why)
		}
		ft = t.fns[key]
		if ft == nil {
			break
		}
		t.mu.Unlock()
		select {
		case <-ft.ready:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if ft.err != nil {
			return nil, false, ft.err
		}
		select {
		case <-ft.f.Done(): // died: replace it
			t.remove(ft)
			continue
		default:
		}
		return ft, false, nil
	}
	rt := t.rt
	if rt == nil {
		t.mu.Unlock()
		return nil, false, fmt.Errorf("%w: the runtime template is not running", errNoTemplate)
	}
	ft = &fnTemplate{key: key, ver: ver, ready: make(chan struct{}), created: time.Now(), lastUsed: time.Now(),
		limitMB: ver.MemoryMB}
	t.fns[key] = ft
	t.mu.Unlock()
	// The creation is shared: it must not fail because the first caller gave up.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.w.cfg.InitTimeout)
	ft.f, ft.initLogs, ft.err = t.create(cctx, rt, ver)
	cancel()
	close(ft.ready)
	if ft.err != nil {
		t.remove(ft)
		return nil, false, ft.err
	}
	t.w.notifyChanged()
	return ft, true, nil
}

// create forks ver's function template from rt and imports the code.
func (t *templates) create(ctx context.Context, rt *template.Runtime, ver function.Version) (*template.Function, []agentproto.LogRecord, error) {
	w := t.w
	if _, err := w.codeDir(ctx, ver); err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	f, err := rt.ForkFunction(ctx, template.FunctionSpec{
		ID: "t" + newInstanceID()[1:], Code: ver.CodeDigest, UID: ver.UID, GID: ver.UID,
		Env: instanceEnv(ver), TmpMB: w.cfg.TmpMB, NoFile: 1024,
		Limits: sandbox.Limits{MemoryMB: ver.MemoryMB, CPUShares: cpuShares(ver.MemoryMB), Pids: w.cfg.PidsLimit},
	})
	if err != nil {
		// The template's sandbox failed, not the function's code (that is
		// imported only below): start instances alone.
		return nil, nil, fmt.Errorf("%w: %v", errNoTemplate, err)
	}
	t1 := time.Now()
	var logs []agentproto.LogRecord
	_, err = f.Client().Init(ctx, agentproto.InitParams{
		Function: ver.Name, Version: ver.Version, Handler: ver.Handler, MemoryMB: ver.MemoryMB,
		Timeout: ver.Timeout(), ARN: ver.ARN(), LogGroup: "/aws/lambda/" + ver.Name, CodeDir: "/var/task",
	}, func(r agentproto.LogRecord) { logs = append(logs, r) })
	if err != nil {
		_ = f.Close(context.WithoutCancel(ctx))
		var ie *agentproto.InitError
		if errors.As(err, &ie) {
			return nil, nil, err // the function's code failed to load: the caller's error
		}
		return nil, nil, fmt.Errorf("%w: init of %s in its template: %v", errNoTemplate, ver.Name, err)
	}
	w.log.Debug("function template ready", "fn", ver.Name, "version", ver.Version, "pid", f.Pid(),
		"fork_template", t1.Sub(t0), "import", time.Since(t1))
	return f, logs, nil
}

// remove forgets ft and stops it.
func (t *templates) remove(ft *fnTemplate) {
	t.mu.Lock()
	if t.fns[ft.key] == ft {
		delete(t.fns, ft.key)
	}
	t.mu.Unlock()
	t.stop(ft)
	t.w.notifyChanged()
}

// stop stops ft's process in the background (once).
func (t *templates) stop(ft *fnTemplate) {
	t.mu.Lock()
	if ft.gone || ft.f == nil {
		ft.gone = true
		t.mu.Unlock()
		return
	}
	ft.gone = true
	t.mu.Unlock()
	t.w.wg.Add(1)
	go func() {
		defer t.w.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ft.f.Close(ctx); err != nil {
			t.w.log.Warn("stop function template", "fn", ft.ver.Name, "version", ft.ver.Version, "err", err)
		}
	}()
}

// refuse makes ver's instances start one by one from now on.
func (t *templates) refuse(ft *fnTemplate, why string) {
	t.mu.Lock()
	t.noFork[ft.key] = why
	t.mu.Unlock()
	t.w.log.Warn("function cannot be forked from a template; its instances start one by one", "fn", ft.ver.Name,
		"version", ft.ver.Version, "reason", why)
	t.remove(ft)
}

// instanceGone is called when an instance forked from ft is stopped.
func (t *templates) instanceGone(ft *fnTemplate) {
	t.mu.Lock()
	ft.live--
	ft.lastUsed = time.Now()
	t.mu.Unlock()
}

// list returns the ready, live function templates.
func (t *templates) list() []*fnTemplate {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fnTemplate
	for _, ft := range t.fns {
		select {
		case <-ft.ready:
			if ft.err == nil && !ft.gone {
				out = append(out, ft)
			}
		default:
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lastUsed.Before(out[j].lastUsed) })
	return out
}

// runtime returns the runtime template, or nil.
func (t *templates) runtime() *template.Runtime {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rt
}

// reap stops function templates of superseded versions (after a grace
// period) and those unused for longer than ttl with no live instance.
func (t *templates) reap(now time.Time, ttl time.Duration) {
	for _, ft := range t.list() {
		t.mu.Lock()
		idle, live := now.Sub(ft.lastUsed), ft.live
		t.mu.Unlock()
		latest, err := t.w.reg.Resolve(ft.ver.Name, 0)
		stale := (err != nil || latest.Version > ft.ver.Version) && idle > 30*time.Second
		if live == 0 && (stale || idle > ttl) {
			t.remove(ft)
		}
	}
}

// fork starts an instance of ver from its function template: warm when the
// template existed, cold when this call created it. errNoTemplate (wrapped)
// means: start it on its own instead.
func (w *Worker) fork(ctx context.Context, ver function.Version) (*instance, string, error) {
	for attempt := 0; ; attempt++ {
		ft, created, err := w.tmpl.get(ctx, ver)
		if err != nil {
			return nil, "", err
		}
		id := newInstanceID()
		t0 := time.Now()
		sb, cl, err := ft.f.Fork(ctx, id, sandbox.Limits{MemoryMB: ver.MemoryMB, CPUShares: cpuShares(ver.MemoryMB), Pids: w.cfg.PidsLimit})
		switch {
		case errors.Is(err, template.ErrInheritedSockets):
			w.tmpl.refuse(ft, err.Error())
			return nil, "", fmt.Errorf("%w: %v", errNoTemplate, err)
		case err != nil && attempt == 0 && ctx.Err() == nil:
			// The template died (killed, OOM): make a new one, once.
			w.log.Warn("fork from function template failed; replacing the template", "fn", ver.Name, "err", err)
			w.tmpl.remove(ft)
			continue
		case err != nil:
			return nil, "", fmt.Errorf("%w: %v", errNoTemplate, err)
		}
		w.tmpl.mu.Lock()
		ft.live++
		ft.lastUsed = time.Now()
		need := ver.MemoryMB + ft.live*forkChargeMB
		raise := need > ft.limitMB
		if raise {
			ft.limitMB = need + 16*forkChargeMB // in steps, not on every fork
		}
		limit := ft.limitMB
		w.tmpl.mu.Unlock()
		if raise {
			if err := ft.f.Sandbox().RaiseMemoryLimit(limit); err != nil {
				w.log.Warn("raise function template memory limit", "fn", ver.Name, "err", err)
			}
		}
		w.log.Debug("instance forked", "fn", ver.Name, "instance", id, "pid", sb.Pid(), "took", time.Since(t0))
		in := &instance{id: id, ver: ver, sb: sb, cl: cl, tmpl: ft}
		start := function.StartWarm
		if created {
			start = function.StartCold
			in.initLogs = ft.initLogs
		}
		w.metrics.instances.WithLabelValues("live").Inc()
		return in, start, nil
	}
}

// functionTemplates lists the function versions this worker holds a
// template of.
func (w *Worker) functionTemplates() []templateKey {
	var out []templateKey
	for _, ft := range w.tmpl.list() {
		out = append(out, templateKey{Name: ft.ver.Name, Version: ft.ver.Version})
	}
	return out
}

type templateKey struct {
	Name    string
	Version int
}

// notifyChanged wakes Changed's waiters.
func (w *Worker) notifyChanged() {
	w.mu.Lock()
	w.notifyChangedLocked()
	w.mu.Unlock()
}
