// Package worker is the node agent: it takes calls from NATS (synchronous
// requests, the durable async queue, deploy validations), places each on an
// instance of the function — an idle one if it has one (hot), a new sandboxed
// one otherwise (cold) — and reports results, call records and logs. It owns
// the instances on its node; isolation itself is the sandbox package's job.
package worker

import (
	"context"
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
	"golang.org/x/sync/singleflight"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
	"github.com/torpor-dev/torpor/runtimes"
)

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
	// NoTemplates turns the fork path off: every instance starts on its
	// own (cold), as before templates.
	NoTemplates bool
	// TemplateTTL stops a function template unused this long with no
	// live instance (default 1 h); the reclaimer stops them sooner when
	// memory runs short.
	TemplateTTL time.Duration
	// The reclaimer's watermarks: when the host's available memory falls
	// below ReclaimLowMB it stops idle instances, then unused function
	// templates, until ReclaimHighMB is available again. 0: 5 % and 10 %
	// of the machine's memory (at least 256 and 512 MB).
	ReclaimLowMB, ReclaimHighMB int
	// EvictionGrace is how long an eviction (SIGTERM, an evict request
	// without a grace of its own) has to move running calls away; 0: none,
	// every running call is abandoned and runs again elsewhere.
	EvictionGrace time.Duration
	// ShortestGrace is the shortest grace an eviction of this worker may
	// get: EvictionGrace, or less when a cloud notice gives less. Calls of
	// functions whose timeout is longer run on instances that can be
	// checkpointed on their own (wantsMovable); 0: EvictionGrace.
	ShortestGrace time.Duration
}

func (c *Config) defaults() {
	if c.ShortestGrace <= 0 || c.ShortestGrace > c.EvictionGrace {
		c.ShortestGrace = c.EvictionGrace
	}
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
	if c.TemplateTTL == 0 {
		c.TemplateTTL = time.Hour
	}
	if c.ReclaimLowMB == 0 {
		c.ReclaimLowMB = max(256, int(totalMemoryMB()/20))
	}
	if c.ReclaimHighMB <= c.ReclaimLowMB {
		c.ReclaimHighMB = c.ReclaimLowMB + max(256, int(totalMemoryMB()/20))
	}
}

// totalMemoryMB reads MemTotal from /proc/meminfo (4 GB if unreadable).
func totalMemoryMB() int64 {
	if mb, err := meminfoMB("MemTotal"); err == nil {
		return int64(mb)
	}
	return 4096
}

// meminfoMB reads one field of /proc/meminfo, in MB.
func meminfoMB(field string) (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int
		if _, err := fmt.Sscanf(line, field+": %d kB", &kb); err == nil {
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// Worker runs calls on sandboxed instances.
type Worker struct {
	cfg       Config
	log       *slog.Logger
	bus       *bus.Bus
	reg       *registry.Registry
	store     *callstore.Store
	sandboxes *sandbox.Manager
	metrics   *Metrics

	snap         *snapshots // nil when snapshots are disabled
	tmpl         *templates
	running      sync.Map // call id → *runningCall
	stats        *callStats
	evictOnce    sync.Once
	evicted      chan struct{} // closed when an eviction is over
	evictReport  api.EvictReport
	agentDir     string
	runtimeBinds []sandbox.Bind
	extract      singleflight.Group
	extractZip   func(ctx context.Context, zip []byte, dir string) error

	mu         sync.Mutex
	idle       map[string][]*instance // by pool key, most recently used last
	slots      map[string]*fnSlots
	liveMB     int           // memory limits of live instances, reserved against MemoryBudgetMB
	capChanged chan struct{} // closed and replaced whenever liveMB drops
	changed    chan struct{} // closed and replaced whenever idle instances or templates change (Changed)

	records     chan function.Call
	recordsDone chan struct{} // closed when recordWriter has flushed and stopped
	subs        []*nats.Subscription

	// Lifecycle. Calls run under callCtx, which is cancelled only when
	// Close runs out of time; the background loops run under loopCtx,
	// cancelled as soon as Close starts. closeMu orders calls.Add against
	// Close's calls.Wait.
	closeMu     sync.RWMutex
	closeOnce   sync.Once
	closing     bool
	calls       sync.WaitGroup // in-flight calls
	wg          sync.WaitGroup // background goroutines
	stopLoops   context.CancelFunc
	stopPublish context.CancelFunc // leaves the worker directory, once the calls are over
	stopTmpl    context.CancelFunc // stops the templates, last
	abandon     context.CancelFunc
	callCtx     context.Context // done once the worker gave up on its calls (abandon)
	stopRecord  chan struct{}

	dumps *dumpQueue // checkpoints of running calls, a few at a time
}

// New prepares a worker; Start connects it to the bus.
func New(ctx context.Context, cfg Config, b *bus.Bus, reg *registry.Registry, calls *callstore.Store, sb *sandbox.Manager, m *Metrics, log *slog.Logger) (*Worker, error) {
	cfg.defaults()
	if cfg.Python == "" {
		return nil, errors.New("worker: no Python interpreter configured")
	}
	w := &Worker{cfg: cfg, log: log.With("worker", cfg.ID), bus: b, reg: reg, store: calls, sandboxes: sb, metrics: m,
		idle: map[string][]*instance{}, slots: map[string]*fnSlots{}, records: make(chan function.Call, 4096),
		capChanged: make(chan struct{}), changed: make(chan struct{}), recordsDone: make(chan struct{}), stopRecord: make(chan struct{}),
		extractZip: codezip.Extract, stats: newCallStats(), evicted: make(chan struct{}),
		dumps: newDumpQueue(maxConcurrentDumps)}
	w.tmpl = newTemplates(w)
	w.agentDir = filepath.Join(cfg.Home, "runtimes", "python")
	if err := os.MkdirAll(w.agentDir, 0o755); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := installAgent(ctx, w.agentDir, cfg.Python); err != nil {
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
func installAgent(ctx context.Context, dir, python string) error {
	path := filepath.Join(dir, runtimes.PythonAgentName)
	if err := os.WriteFile(path, runtimes.PythonAgent, 0o644); err != nil {
		return fmt.Errorf("install python agent: %w", err)
	}
	if out, err := exec.CommandContext(ctx, python, "-I", "-m", "py_compile", path).CombinedOutput(); err != nil {
		return fmt.Errorf("precompile python agent with %s: %v: %s", python, err, out)
	}
	return nil
}

func underUsr(p string) bool { return p == "/usr" || strings.HasPrefix(p, "/usr/") }

// Start subscribes to calls and starts the background loops.
func (w *Worker) Start(ctx context.Context) error {
	callCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	loopCtx, stopLoops := context.WithCancel(ctx)
	w.abandon, w.stopLoops, w.callCtx = abandon, stopLoops, callCtx
	sub, err := w.bus.NC.QueueSubscribe(bus.SubjInvoke+"*", bus.Workers, func(m *nats.Msg) {
		if !w.track(func() { w.handleSync(callCtx, m) }) {
			_ = m.RespondMsg(callmsg.ErrorReply(errShuttingDown(w.cfg.ID)))
		}
	})
	if err != nil {
		return fmt.Errorf("worker: subscribe to calls: %w", err)
	}
	w.subs = append(w.subs, sub)
	if w.snap != nil {
		handle := func(m *nats.Msg) {
			if !w.track(func() { w.handleSnapshot(callCtx, m) }) {
				_ = m.RespondMsg(callmsg.ErrorReply(errShuttingDown(w.cfg.ID)))
			}
		}
		// Any worker, or this one by name (for its instances and calls).
		for _, subj := range []string{bus.SubjSnapshot, bus.SnapshotSubject(w.cfg.ID)} {
			if sub, err = w.bus.NC.QueueSubscribe(subj, bus.Workers, handle); err != nil {
				return fmt.Errorf("worker: subscribe to snapshot requests: %w", err)
			}
			w.subs = append(w.subs, sub)
		}
	}
	sub, err = w.bus.NC.QueueSubscribe(bus.SubjValidate, bus.Workers, func(m *nats.Msg) {
		if !w.track(func() { w.handleValidate(callCtx, m) }) {
			_ = m.RespondMsg(callmsg.ErrorReply(errShuttingDown(w.cfg.ID)))
		}
	})
	if err != nil {
		return fmt.Errorf("worker: subscribe to validations: %w", err)
	}
	w.subs = append(w.subs, sub)
	if sub, err = w.subscribeEvict(); err != nil {
		return err
	}
	w.subs = append(w.subs, sub)
	dirSubs, err := w.subscribeDirectory(callCtx)
	if err != nil {
		return err
	}
	w.subs = append(w.subs, dirSubs...)
	if err := w.bus.NC.Flush(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	cons, err := w.bus.CallQueue.Consumer(ctx, bus.ConsumerCalls)
	if err != nil {
		return fmt.Errorf("worker: async consumer: %w", err)
	}
	// The directory entry outlives intake: a draining worker's entry says
	// so, and stays fresh while its calls run, so that a dispatcher sees
	// the worker die should it be killed before they are over.
	pubCtx, stopPublish := context.WithCancel(context.WithoutCancel(ctx))
	w.stopPublish = stopPublish
	w.wg.Add(4)
	go func() { defer w.wg.Done(); w.asyncLoop(loopCtx, callCtx, cons) }()
	go func() { defer w.wg.Done(); w.reaper(loopCtx) }()
	go func() { defer w.wg.Done(); w.reclaimer(loopCtx) }()
	go func() { defer w.wg.Done(); w.publishLoop(pubCtx) }()
	// The templates outlive the loops: running calls' instances are
	// their children. Close stops them last.
	tmplCtx, stopTmpl := context.WithCancel(context.WithoutCancel(ctx))
	w.stopTmpl = stopTmpl
	if !w.cfg.NoTemplates {
		w.wg.Add(1)
		go func() { defer w.wg.Done(); w.tmpl.run(tmplCtx) }()
	}
	go w.recordWriter()
	if err := w.watchStartSnapshots(loopCtx); err != nil {
		return err
	}
	w.log.Info("worker started", "python", w.cfg.Python, "cgroup", w.sandboxes.CgroupVersion())
	return nil
}

// errAbandoned matches the error of a call the worker stopped unfinished
// and without a checkpoint (abandonError): it did not move, and runs again
// from the start elsewhere.
var errAbandoned = fmt.Errorf("%w: %w", callmsg.ErrAbandoned, errdefs.ErrUnavailable)

// abandonError is a call given up by its worker, and why: the eviction's
// grace ran out (function.ReasonEviction), or a failed checkpoint took its
// process (ReasonCheckpointFailed).
type abandonError struct {
	reason string
	err    error
}

func abandoned(reason string, err error) error { return &abandonError{reason: reason, err: err} }

func (e *abandonError) Error() string {
	return fmt.Sprintf("%v (%s): %v", errAbandoned, e.reason, e.err)
}
func (e *abandonError) Unwrap() []error       { return []error{errAbandoned, e.err} }
func (e *abandonError) AbandonReason() string { return e.reason }

// gaveUp reports whether the worker gave up on its running calls: an
// eviction's or shutdown's grace ran out.
func (w *Worker) gaveUp() bool { return w.callCtx != nil && w.callCtx.Err() != nil }

func errShuttingDown(id string) error {
	return fmt.Errorf("worker %s is shutting down: %w: %w", id, callmsg.ErrClosing, errdefs.ErrUnavailable)
}

// track runs f as an in-flight call, unless the worker is closing.
func (w *Worker) track(f func()) bool {
	w.closeMu.RLock()
	defer w.closeMu.RUnlock()
	if w.closing {
		return false
	}
	w.calls.Add(1)
	go func() { defer w.calls.Done(); f() }()
	return true
}

// Close stops taking calls, lets the running ones finish (until ctx ends;
// then they are abandoned), flushes call records and stops every instance.
func (w *Worker) Close(ctx context.Context) {
	w.closeOnce.Do(func() { w.close(ctx) })
}

// stopIntake makes the worker take no new calls: it leaves the queue
// groups, marks its directory entry draining and stops fetching async
// calls. Calls already running carry on.
func (w *Worker) stopIntake() {
	w.closeMu.Lock()
	already := w.closing
	w.closing = true
	w.closeMu.Unlock()
	if already {
		return
	}
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	if w.stopLoops != nil {
		w.stopLoops()
	}
	w.notifyChanged() // publish the draining entry now
}

func (w *Worker) close(ctx context.Context) {
	w.stopIntake()
	if !waitCtx(ctx, &w.calls) {
		w.log.Warn("shutdown grace period over: abandoning running calls")
		w.abandon()
		actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		waitCtx(actx, &w.calls)
		cancel()
	}
	if w.abandon != nil {
		w.abandon()
	}
	// The records of finished calls are queued by now. Writing them takes
	// milliseconds and is worth it even when the grace is over: a call
	// that finished must not lose its record with its worker.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeFlush)
	defer cancel()
	close(w.stopRecord)
	select {
	case <-w.recordsDone:
	case <-fctx.Done():
		w.log.Warn("call records not all written before the worker closed", "err", fctx.Err())
	}
	if w.stopPublish != nil {
		w.stopPublish()
	}
	w.mu.Lock()
	var all []*instance
	for k, list := range w.idle {
		all = append(all, list...)
		delete(w.idle, k)
	}
	w.mu.Unlock()
	for _, in := range all {
		w.retire(in)
	}
	if w.stopTmpl != nil {
		w.stopTmpl()
	}
	waitCtx(fctx, &w.wg)
}

// closeFlush bounds what Close does after the calls are over: writing
// their records, leaving the directory, stopping the instances.
const closeFlush = 10 * time.Second

// waitCtx waits for wg, or until ctx ends; it reports whether wg finished.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
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
			w.notifyChangedLocked()
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
		if id := w.startSnapshot(ver); id != "" {
			in, err := w.restore(ctx, ver, id)
			if err == nil {
				return in, function.StartRestore, nil
			}
			// A snapshot that cannot be used costs this call a cold
			// start, never its result.
			w.metrics.restoreFailures.Inc()
			w.log.Warn("restore failed, starting cold instead", "fn", ver.Name, "version", ver.Version,
				"snapshot", id, "refused", image.IsRefused(err), "err", err)
		}
		in, start, err := w.startNew(ctx, ver)
		if err != nil {
			w.unreserve(ver.MemoryMB)
		}
		return in, start, err
	}
}

// startNew starts a new instance of ver, its memory already reserved:
// forked from its function template (warm, or cold when the template is
// made for it), or, when the fork path cannot serve it, on its own (cold).
func (w *Worker) startNew(ctx context.Context, ver function.Version) (*instance, string, error) {
	if !w.cfg.NoTemplates && !w.wantsMovable(ver) {
		in, start, err := w.fork(ctx, ver)
		if err == nil || !errors.Is(err, errNoTemplate) {
			return in, start, err
		}
		w.metrics.forkFallbacks.Inc()
		w.log.Debug("starting instance on its own", "fn", ver.Name, "version", ver.Version, "reason", err)
	}
	in, err := w.spawn(ctx, ver)
	return in, function.StartCold, err
}

// reserve admits a new instance of mb MB against the worker's memory budget.
// When the budget is used up it stops idle instances, least recently used
// first; when only busy instances remain it waits for one to go, at most
// wait (0: as long as ctx allows).
func (w *Worker) reserve(ctx context.Context, mb int, wait time.Duration) error {
	if mb > w.cfg.MemoryBudgetMB {
		return errdefs.Invalid(fmt.Sprintf("the function's memory limit of %d MB exceeds this worker's memory budget of %d MB", mb, w.cfg.MemoryBudgetMB))
	}
	timeout, stop := optionalTimer(wait)
	defer stop()
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
			return fmt.Errorf("waiting for memory: %v: %w", ctx.Err(), errdefs.ErrUnavailable)
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
	var victims []*instance
	for _, in := range w.idleByLRULocked() {
		if need <= 0 {
			break
		}
		w.removeIdleLocked(in)
		need -= in.ver.MemoryMB
		w.liveMB -= in.ver.MemoryMB
		victims = append(victims, in)
	}
	return victims
}

// removeIdleLocked takes in out of the idle pool (w.mu held).
func (w *Worker) removeIdleLocked(in *instance) {
	key := poolKey(in.ver.Name, in.ver.Version)
	list := w.idle[key]
	for i, x := range list {
		if x == in {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.idle, key)
	} else {
		w.idle[key] = list
	}
	w.notifyChangedLocked()
}

// idleByLRULocked lists the idle instances, least recently used first
// (w.mu held).
func (w *Worker) idleByLRULocked() []*instance {
	var all []*instance
	for _, l := range w.idle {
		all = append(all, l...)
	}
	byLRU(all)
	return all
}

// byLRU sorts instances least recently used first.
func byLRU(l []*instance) {
	sort.Slice(l, func(i, j int) bool { return l[i].lastUsed.Before(l[j].lastUsed) })
}

// release parks a healthy instance for reuse.
func (w *Worker) release(in *instance) {
	in.lastUsed = time.Now()
	w.mu.Lock()
	key := poolKey(in.ver.Name, in.ver.Version)
	w.idle[key] = append(w.idle[key], in)
	w.notifyChangedLocked()
	w.mu.Unlock()
	w.metrics.instances.WithLabelValues("idle").Inc()
}

// retire stops an instance that must not be reused.
func (w *Worker) retire(in *instance) {
	w.metrics.instances.WithLabelValues("live").Dec()
	w.unreserve(in.ver.MemoryMB)
	w.destroy(in)
}

// optionalTimer returns a channel that fires after d, or never when d is 0.
func optionalTimer(d time.Duration) (<-chan time.Time, func() bool) {
	if d <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// fnSlots bounds a function's parallel calls on this worker.
type fnSlots struct {
	ch      chan struct{}
	version int // the version whose Concurrency sized ch
}

// slot takes a concurrency slot of the function, when it has a limit.
func (w *Worker) slot(ctx context.Context, ver function.Version, wait time.Duration) (func(), error) {
	if ver.Concurrency <= 0 {
		return func() {}, nil
	}
	w.mu.Lock()
	sl := w.slots[ver.Name]
	// The limit is the function's, across its versions: the newest
	// version's setting wins (an older one never resets it).
	if sl == nil || sl.version < ver.Version && cap(sl.ch) != ver.Concurrency {
		sl = &fnSlots{ch: make(chan struct{}, ver.Concurrency), version: ver.Version}
		w.slots[ver.Name] = sl
	}
	ch := sl.ch
	w.mu.Unlock()
	timeout, stop := optionalTimer(wait)
	defer stop()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-timeout:
		return nil, fmt.Errorf("function %s is at its concurrency limit of %d: retry later or raise --concurrency: %w",
			ver.Name, ver.Concurrency, errdefs.ErrThrottled)
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a concurrency slot: %v: %w", ctx.Err(), errdefs.ErrUnavailable)
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
	if err == nil && in.start == "" {
		in.start = start
	}
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
	return w.run(ctx, ver, req, in, res, logs, hopState{})
}

// hopState is what a call brings from the workers it ran on before.
type hopState struct {
	elapsed time.Duration // handler time so far
	n       int           // moves so far
	resumed bool          // in is the call's restored checkpoint: collect its outcome, do not invoke
}

// sliceReserve is how long before its slice ends a sliced call is asked
// to leave: enough for the hand-over, which happens between two bytecodes.
func sliceReserve(slice time.Duration) time.Duration {
	return min(max(slice/20, 20*time.Millisecond), time.Second)
}

// run runs (or, resumed, collects) the call on in and returns its outcome,
// or a *moved error when it left as a checkpoint (in is gone then).
func (w *Worker) run(ctx context.Context, ver function.Version, req function.InvokeRequest, in *instance, res function.InvokeResult,
	logs *callLog, h hopState) (function.InvokeResult, func(), error) {
	t1 := time.Now()
	remaining := ver.MaxDuration() - h.elapsed
	slice := min(ver.Timeout(), remaining)
	last := remaining <= ver.Timeout()
	rc := w.startRunning(req.CallID, in, res.Start, ver, h.elapsed, t1, t1.Add(max(slice, 0)))
	params := agentproto.InvokeParams{ID: req.CallID, Payload: req.Payload, Deadline: t1.Add(remaining)}
	if rc.movable {
		params.CheckpointListen = ctlListen
		if !last {
			t := time.AfterFunc(slice-sliceReserve(slice), func() { rc.leave(function.ReasonSlice) })
			defer t.Stop()
		}
	}
	ictx, icancel := context.WithDeadline(ctx, t1.Add(max(slice, 0)))
	var out []byte
	var ferr *function.Error
	var err error
	for dumps := 0; ; {
		if h.resumed {
			out, ferr, err = in.cl.Await(ictx, req.CallID, logs.add)
		} else {
			out, ferr, err = in.cl.Invoke(ictx, params, logs.add)
		}
		var ck *agentproto.Checkpointed
		if !errors.As(err, &ck) {
			break
		}
		// The agent handed the call over and waits, parked, to be dumped
		// or let go.
		rc.armed.Store(false)
		h.resumed = true
		if !rc.leaving() {
			// Nobody asked: a signal of the last call's that landed late,
			// or the handler's own. The call runs on.
			if _, err = w.reconnect(ctx, in, false); err != nil {
				err = abandoned(function.ReasonCrash, fmt.Errorf("call %s: resume after a hand-over nobody asked for: %w", req.CallID, err))
				break
			}
			rc.armed.Store(true)
			continue
		}
		ran := time.Since(t1) // a parked call waiting for its turn does not run
		release, qerr := w.dumps.acquire(ctx, rc.rank())
		if qerr != nil { // the worker gave up on its calls (the grace is over), or the caller went away
			err = qerr
			break
		}
		dumps++
		mv, cerr := w.checkpointCall(ctx, rc, ck, h.n+1, ran)
		release()
		if cerr == nil {
			icancel()
			rc.movedAs.Store(&mv.snapshot)
			w.stopRunning(rc)
			w.retire(in) // CRIU killed it after the dump
			logs.platform(fmt.Sprintf("MOVED RequestId: %s Snapshot: %s Reason: %s Checkpoint: %.2f ms Image: %d bytes",
				req.CallID, mv.snapshot, mv.attempt.Reason, mv.attempt.CheckpointMS, mv.attempt.ImageBytes))
			w.publishLogs(logs)
			return res, noop, mv
		}
		if ctx.Err() != nil { // the grace ran out (or the caller went away) during the dump
			err = ctx.Err()
			break
		}
		w.log.Warn("checkpoint of a running call failed; it runs on here", "fn", ver.Name, "call", req.CallID, "attempt", dumps, "err", cerr)
		if _, err = w.reconnect(ctx, in, false); err != nil {
			// The failed dump took the process with it: the call runs
			// again from the start elsewhere (at least once).
			err = abandoned(function.ReasonCheckpointFailed, fmt.Errorf("call %s lost in a failed checkpoint (%v): %w", req.CallID, cerr, err))
			break
		}
		rc.armed.Store(dumps < maxDumpAttempts)
	}
	w.stopRunning(rc)
	in.lastCall = req.CallID
	res.Duration = time.Since(t1)
	icancel()
	switch {
	case err == nil:
		res.Payload, res.Err = out, ferr
		if ferr == nil && len(out) > function.MaxPayloadBytes {
			res.Payload, res.Err = nil, &function.Error{ErrorType: "Function.ResponseSizeTooLarge", ErrorMessage: fmt.Sprintf(
				"Response payload size (%d bytes) exceeded maximum allowed payload size (%d bytes).", len(out), function.MaxPayloadBytes)}
		}
		w.stats.observeDuration(ver, h.elapsed+res.Duration)
		w.release(in)
	case ctx.Err() != nil && w.gaveUp():
		w.retire(in)
		return res, noop, abandoned(function.ReasonEviction, fmt.Errorf("call %s: %w", req.CallID, ctx.Err()))
	case ctx.Err() != nil:
		// An in-process caller went away (Serve): the call ends with it.
		// It is not abandoned, so nobody runs it again.
		w.retire(in)
		return res, noop, fmt.Errorf("call %s: its caller went away: %w", req.CallID, ctx.Err())
	case errors.Is(err, errAbandoned):
		w.retire(in)
		return res, noop, err
	case errors.Is(err, context.DeadlineExceeded) || time.Now().After(t1.Add(slice)):
		w.retire(in)
		msg := fmt.Sprintf("Task timed out after %.2f seconds", ver.TimeoutSec)
		switch {
		case ver.Sliced() && last:
			msg = fmt.Sprintf("Task timed out after %.2f seconds in all (max duration)", ver.MaxDuration().Seconds())
		case ver.Sliced():
			msg = fmt.Sprintf("Task timed out after %.2f seconds: the slice ended before the call could be checkpointed (%s)",
				ver.TimeoutSec, rc.deferral())
		}
		res.Err = &function.Error{ErrorType: "Sandbox.Timedout", ErrorMessage: msg}
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
		if len(victims) > 0 {
			w.notifyChangedLocked()
		}
		if over := len(kept) - w.cfg.MaxIdle; over > 0 {
			byLRU(kept)
			for _, in := range kept[:over] {
				w.removeIdleLocked(in)
				victims = append(victims, in)
			}
		}
		w.mu.Unlock()
		for _, in := range victims {
			w.metrics.instances.WithLabelValues("idle").Dec()
			w.retire(in)
		}
		w.tmpl.reap(now, w.cfg.TemplateTTL)
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
