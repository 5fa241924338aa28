// Package worker is the node agent: it takes calls from NATS (synchronous
// requests, the durable async queue, deploy validations), places each on an
// instance of the function — an idle one if it has one (hot), a new sandboxed
// one otherwise (cold) — and reports results, call records and logs. It owns
// the instances on its node; isolation itself is the sandbox package's job.
package worker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/singleflight"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/runtimes"
)

var randRead = rand.Read

// Config tunes a worker.
type Config struct {
	ID          string        // worker id, shown in call records
	Home        string        // state dir: code cache, runtime files
	Python      string        // absolute path of the Python interpreter
	PythonHome  string        // its sys.base_prefix, bound read-only into sandboxes when outside /usr
	IdleTTL     time.Duration // an idle instance is stopped after this long unused
	MaxIdle     int           // most idle instances kept on this worker (LRU beyond)
	QueueWait   time.Duration // how long a sync call waits for a concurrency slot before 429
	AsyncSlots  int           // async calls run in parallel on this worker
	InitTimeout time.Duration // interpreter start + code import
	PidsLimit   int
	TmpMB       int
	HostNetwork bool // share the host's network namespace (trusted tenants only)
	// MemoryBudgetMB caps the sum of the memory limits of live instances;
	// 0 means three quarters of the machine's memory.
	MemoryBudgetMB int
}

func (c *Config) defaults() {
	if c.IdleTTL == 0 {
		c.IdleTTL = 10 * time.Minute
	}
	if c.MaxIdle == 0 {
		c.MaxIdle = 256
	}
	if c.QueueWait == 0 {
		c.QueueWait = time.Second
	}
	if c.AsyncSlots == 0 {
		c.AsyncSlots = 4 * runtime.NumCPU()
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = 30 * time.Second
	}
	if c.PidsLimit == 0 {
		c.PidsLimit = 128
	}
	if c.TmpMB == 0 {
		c.TmpMB = 512
	}
	if c.MemoryBudgetMB == 0 {
		c.MemoryBudgetMB = int(totalMemoryMB() * 3 / 4)
	}
}

// totalMemoryMB reads MemTotal from /proc/meminfo (4 GB if unreadable).
func totalMemoryMB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		var kb int64
		for _, line := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				return kb / 1024
			}
		}
	}
	return 4096
}

// Worker runs calls on sandboxed instances.
type Worker struct {
	cfg       Config
	log       *slog.Logger
	bus       *bus.Bus
	reg       *registry.Registry
	calls     *callstore.Store
	sandboxes *sandbox.Manager
	metrics   *Metrics

	agentDir     string
	runtimeBinds []sandbox.Bind
	extract      singleflight.Group
	extractZip   func(ctx context.Context, zip []byte, dir string) error

	mu         sync.Mutex
	idle       map[string][]*instance // by pool key, most recently used last
	slots      map[string]chan struct{}
	liveMB     int           // memory limits of live instances, reserved against MemoryBudgetMB
	capChanged chan struct{} // closed and replaced whenever liveMB drops

	records chan function.Call
	subs    []*nats.Subscription
	cancel  context.CancelFunc
	wg      sync.WaitGroup // background goroutines and in-flight calls
}

// New prepares a worker; Start connects it to the bus.
func New(cfg Config, b *bus.Bus, reg *registry.Registry, calls *callstore.Store, sb *sandbox.Manager, m *Metrics, log *slog.Logger) (*Worker, error) {
	cfg.defaults()
	if cfg.Python == "" {
		return nil, errors.New("worker: no Python interpreter configured")
	}
	w := &Worker{cfg: cfg, log: log.With("worker", cfg.ID), bus: b, reg: reg, calls: calls, sandboxes: sb, metrics: m,
		idle: map[string][]*instance{}, slots: map[string]chan struct{}{}, records: make(chan function.Call, 4096),
		capChanged: make(chan struct{}),
		extractZip: codezip.Extract}
	w.agentDir = filepath.Join(cfg.Home, "runtimes", "python")
	if err := os.MkdirAll(w.agentDir, 0o755); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := installAgent(w.agentDir, cfg.Python); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Home, "code"), 0o700); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if cfg.PythonHome != "" && !underUsr(cfg.PythonHome) {
		w.runtimeBinds = append(w.runtimeBinds, sandbox.Bind{Source: cfg.PythonHome, Target: cfg.PythonHome})
	}
	return w, nil
}

// installAgent writes the Python agent out and precompiles it with the
// instances' interpreter, so that no instance pays for compiling it.
func installAgent(dir, python string) error {
	path := filepath.Join(dir, runtimes.PythonAgentName)
	if err := os.WriteFile(path, runtimes.PythonAgent, 0o644); err != nil {
		return fmt.Errorf("install python agent: %w", err)
	}
	if out, err := exec.Command(python, "-I", "-m", "py_compile", path).CombinedOutput(); err != nil {
		return fmt.Errorf("precompile python agent with %s: %v: %s", python, err, out)
	}
	return nil
}

func underUsr(p string) bool { return p == "/usr" || len(p) > 5 && p[:5] == "/usr/" }

// Start subscribes to calls and starts the background loops.
func (w *Worker) Start(ctx context.Context) error {
	ctx, w.cancel = context.WithCancel(ctx)
	sub, err := w.bus.NC.QueueSubscribe(bus.SubjInvoke+"*", bus.Workers, func(m *nats.Msg) {
		w.wg.Add(1)
		go func() { defer w.wg.Done(); w.handleSync(ctx, m) }()
	})
	if err != nil {
		return fmt.Errorf("worker: subscribe to calls: %w", err)
	}
	w.subs = append(w.subs, sub)
	sub, err = w.bus.NC.QueueSubscribe(bus.SubjValidate, bus.Workers, func(m *nats.Msg) {
		w.wg.Add(1)
		go func() { defer w.wg.Done(); w.handleValidate(ctx, m) }()
	})
	if err != nil {
		return fmt.Errorf("worker: subscribe to validations: %w", err)
	}
	w.subs = append(w.subs, sub)
	if err := w.bus.NC.Flush(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	cons, err := w.bus.CallQueue.Consumer(ctx, bus.ConsumerCalls)
	if err != nil {
		return fmt.Errorf("worker: async consumer: %w", err)
	}
	w.wg.Add(3)
	go func() { defer w.wg.Done(); w.asyncLoop(ctx, cons) }()
	go func() { defer w.wg.Done(); w.reaper(ctx) }()
	go func() { defer w.wg.Done(); w.recordWriter(ctx) }()
	w.log.Info("worker started", "python", w.cfg.Python, "cgroup", w.sandboxes.CgroupVersion())
	return nil
}

// Close stops taking calls, waits for the running ones (bounded by ctx) and
// stops every instance.
func (w *Worker) Close(ctx context.Context) {
	for _, s := range w.subs {
		_ = s.Drain()
	}
	if w.cancel != nil {
		w.cancel()
	}
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		w.log.Warn("worker closed with calls still running")
	}
	w.mu.Lock()
	var all []*instance
	for k, list := range w.idle {
		all = append(all, list...)
		delete(w.idle, k)
	}
	w.mu.Unlock()
	for _, in := range all {
		_ = in.cl.Close()
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = in.sb.Destroy(dctx)
		cancel()
	}
}

func poolKey(name string, version int) string { return name + "@" + strconv.Itoa(version) }

// acquire returns an instance of ver: an idle one (hot) or a new one (cold).
func (w *Worker) acquire(ctx context.Context, ver function.Version, wait time.Duration) (*instance, string, error) {
	key := poolKey(ver.Name, ver.Version)
	for {
		w.mu.Lock()
		list := w.idle[key]
		if n := len(list); n > 0 {
			in := list[n-1]
			w.idle[key] = list[:n-1]
			w.mu.Unlock()
			w.metrics.instances.WithLabelValues("idle").Dec()
			if !in.alive() {
				w.retire(in)
				continue
			}
			return in, function.StartHot, nil
		}
		w.mu.Unlock()
		if err := w.reserve(ctx, ver.MemoryMB, wait); err != nil {
			return nil, function.StartCold, err
		}
		in, err := w.spawn(ctx, ver)
		if err != nil {
			w.unreserve(ver.MemoryMB)
		}
		return in, function.StartCold, err
	}
}

// reserve admits a new instance of mb MB against the worker's memory budget.
// When the budget is used up it stops idle instances, least recently used
// first; when only busy instances remain it waits for one to go, at most
// wait (0: as long as ctx allows).
func (w *Worker) reserve(ctx context.Context, mb int, wait time.Duration) error {
	if mb > w.cfg.MemoryBudgetMB {
		return errdefs.Invalid(fmt.Sprintf("the function's memory limit of %d MB exceeds this worker's memory budget of %d MB", mb, w.cfg.MemoryBudgetMB))
	}
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		w.mu.Lock()
		victims := w.evictIdleLocked(w.liveMB + mb - w.cfg.MemoryBudgetMB)
		fits := w.liveMB+mb <= w.cfg.MemoryBudgetMB
		if fits {
			w.liveMB += mb
		}
		ch := w.capChanged
		w.mu.Unlock()
		for _, in := range victims {
			w.metrics.instances.WithLabelValues("idle").Dec()
			w.metrics.instances.WithLabelValues("live").Dec()
			w.destroy(in)
		}
		if fits {
			return nil
		}
		select {
		case <-ch:
		case <-timeout:
			return fmt.Errorf("worker %s is at its memory budget of %d MB with every instance busy: retry later: %w",
				w.cfg.ID, w.cfg.MemoryBudgetMB, errdefs.ErrThrottled)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// unreserve returns an instance's memory to the budget.
func (w *Worker) unreserve(mb int) {
	w.mu.Lock()
	w.liveMB -= mb
	close(w.capChanged)
	w.capChanged = make(chan struct{})
	w.mu.Unlock()
}

// evictIdleLocked takes idle instances, least recently used first, until
// their memory limits add up to need MB, and returns them (w.mu held).
func (w *Worker) evictIdleLocked(need int) []*instance {
	if need <= 0 {
		return nil
	}
	var all []*instance
	for _, l := range w.idle {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].lastUsed.Before(all[j].lastUsed) })
	var victims []*instance
	for _, in := range all {
		if need <= 0 {
			break
		}
		key := poolKey(in.ver.Name, in.ver.Version)
		list := w.idle[key]
		for i, x := range list {
			if x == in {
				w.idle[key] = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(w.idle[key]) == 0 {
			delete(w.idle, key)
		}
		need -= in.ver.MemoryMB
		w.liveMB -= in.ver.MemoryMB
		victims = append(victims, in)
	}
	return victims
}

// release parks a healthy instance for reuse.
func (w *Worker) release(in *instance) {
	in.lastUsed = time.Now()
	w.mu.Lock()
	key := poolKey(in.ver.Name, in.ver.Version)
	w.idle[key] = append(w.idle[key], in)
	w.mu.Unlock()
	w.metrics.instances.WithLabelValues("idle").Inc()
}

// retire stops an instance that must not be reused.
func (w *Worker) retire(in *instance) {
	w.metrics.instances.WithLabelValues("live").Dec()
	w.unreserve(in.ver.MemoryMB)
	w.destroy(in)
}

// slot takes a concurrency slot of the function, when it has a limit.
func (w *Worker) slot(ctx context.Context, ver function.Version, wait time.Duration) (func(), error) {
	if ver.Concurrency <= 0 {
		return func() {}, nil
	}
	w.mu.Lock()
	ch := w.slots[ver.Name]
	if ch == nil || cap(ch) != ver.Concurrency {
		ch = make(chan struct{}, ver.Concurrency)
		w.slots[ver.Name] = ch
	}
	w.mu.Unlock()
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-timeout:
		return nil, fmt.Errorf("function %s is at its concurrency limit of %d: retry later or raise --concurrency: %w",
			ver.Name, ver.Concurrency, errdefs.ErrThrottled)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// execute runs one call. A handler failure is a result with Err set; an
// error means the platform could not run the call. The caller runs the
// returned func once it has replied: it completes and publishes the call's log.
func (w *Worker) execute(ctx context.Context, req function.InvokeRequest, queueWait time.Duration) (function.InvokeResult, func(), error) {
	res := function.InvokeResult{CallID: req.CallID, Version: req.Version}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ver, err := w.reg.ResolveWait(rctx, req.Function, req.Version)
	cancel()
	if err != nil {
		return res, noop, err
	}
	release, err := w.slot(ctx, ver, queueWait)
	if err != nil {
		return res, noop, err
	}
	defer release()

	t0 := time.Now()
	in, start, err := w.acquire(ctx, ver, queueWait)
	res.Start = start
	res.StartTime = time.Since(t0)
	w.metrics.starts.WithLabelValues(start).Observe(res.StartTime.Seconds())
	logs := newCallLog(ver, req.CallID)
	if err != nil {
		var ie *agentproto.InitError
		if errors.As(err, &ie) {
			fe := ie.Err
			res.Err = &fe
			logs.finish(res, 0)
			w.publishLogs(logs)
			return res, noop, nil
		}
		return res, noop, err
	}
	if len(in.initLogs) > 0 {
		for _, r := range in.initLogs {
			logs.add(r)
		}
		in.initLogs = nil
	}
	deadline := time.Now().Add(ver.Timeout())
	ictx, icancel := context.WithDeadline(ctx, deadline)
	t1 := time.Now()
	out, ferr, err := in.cl.Invoke(ictx, agentproto.InvokeParams{ID: req.CallID, Payload: req.Payload, Deadline: deadline}, logs.add)
	res.Duration = time.Since(t1)
	icancel()
	switch {
	case err == nil:
		res.Payload, res.Err = out, ferr
		w.release(in)
	case ctx.Err() != nil:
		w.retire(in)
		return res, noop, fmt.Errorf("call %s abandoned: %w", req.CallID, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline):
		w.retire(in)
		res.Err = &function.Error{ErrorType: "Sandbox.Timedout",
			ErrorMessage: fmt.Sprintf("Task timed out after %.2f seconds", ver.TimeoutSec)}
	default:
		res.Err = w.deathError(in)
		if res.Err == nil {
			res.Err = &function.Error{ErrorType: "Runtime.ExitError", ErrorMessage: "Runtime failed: " + err.Error()}
		}
		w.retire(in)
	}
	// The REPORT line's memory figure and the log publish cost tens of
	// microseconds: unless the caller wants the log tail now, they happen
	// after the reply.
	closeLog := func() {
		var peak uint64
		if st, err := in.sb.Stats(); err == nil {
			peak = st.MaxMemoryBytes
		}
		logs.finish(res, peak)
		w.publishLogs(logs)
	}
	if req.LogTail {
		closeLog()
		res.LogTail = logs.tail(4096)
		return res, noop, nil
	}
	return res, closeLog, nil
}

func noop() {}

// reaper stops instances idle past the TTL, instances of superseded versions,
// and the least recently used ones beyond MaxIdle.
func (w *Worker) reaper(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var victims, kept []*instance
		w.mu.Lock()
		for key, list := range w.idle {
			var keep []*instance
			for _, in := range list {
				// Superseded (or deleted) versions go after a grace period,
				// which also covers a validated version not yet committed.
				latest, err := w.reg.Resolve(in.ver.Name, 0)
				stale := (err != nil || latest.Version > in.ver.Version) && now.Sub(in.lastUsed) > 30*time.Second
				if stale || now.Sub(in.lastUsed) > w.cfg.IdleTTL || !in.alive() {
					victims = append(victims, in)
				} else {
					keep = append(keep, in)
				}
			}
			if len(keep) == 0 {
				delete(w.idle, key)
			} else {
				w.idle[key] = keep
			}
			kept = append(kept, keep...)
		}
		if over := len(kept) - w.cfg.MaxIdle; over > 0 {
			sort.Slice(kept, func(i, j int) bool { return kept[i].lastUsed.Before(kept[j].lastUsed) })
			for _, in := range kept[:over] {
				key := poolKey(in.ver.Name, in.ver.Version)
				list := w.idle[key]
				for i, x := range list {
					if x == in {
						w.idle[key] = append(list[:i], list[i+1:]...)
						break
					}
				}
				victims = append(victims, in)
			}
		}
		w.mu.Unlock()
		for _, in := range victims {
			w.metrics.instances.WithLabelValues("idle").Dec()
			w.retire(in)
		}
	}
}

// IdleInstances reports how many idle instances the worker holds.
func (w *Worker) IdleInstances() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.idle {
		n += len(l)
	}
	return n
}

var _ = jetstream.ErrNoMessages
