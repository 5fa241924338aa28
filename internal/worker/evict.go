package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Evictions (R-Check's eviction watcher and Algorithm 4.1, with its
// future work: calls predicted to finish within the grace period are let
// finish). See docs/migration.md.

// callStats learns, per function version, how long calls run and how
// long their checkpoints take: exponentially weighted means and mean
// absolute deviations.
type callStats struct {
	mu   sync.Mutex
	runs map[string]*ewma
	ckpt map[string]*ewma
}

type ewma struct {
	n         int
	mean, dev float64 // seconds
}

func (e *ewma) add(x float64) {
	const a = 0.2
	if e.n == 0 {
		e.mean = x
	} else {
		e.dev = (1-a)*e.dev + a*math.Abs(x-e.mean)
		e.mean = (1-a)*e.mean + a*x
	}
	e.n++
}

// high is a pessimistic estimate: the mean plus three deviations.
func (e *ewma) high() time.Duration {
	return time.Duration((e.mean + 3*e.dev) * float64(time.Second))
}

func newCallStats() *callStats {
	return &callStats{runs: map[string]*ewma{}, ckpt: map[string]*ewma{}}
}

func (s *callStats) observe(m map[string]*ewma, ver function.Version, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := poolKey(ver.Name, ver.Version)
	e := m[k]
	if e == nil {
		e = &ewma{}
		m[k] = e
	}
	e.add(d.Seconds())
}

func (s *callStats) observeDuration(ver function.Version, d time.Duration) { s.observe(s.runs, ver, d) }
func (s *callStats) observeCheckpoint(ver function.Version, d time.Duration) {
	s.observe(s.ckpt, ver, d)
}

// minRunsToPredict is how many finished calls of a version it takes
// before its calls are predicted; until then each is checkpointed.
const minRunsToPredict = 5

// predictRun is how long a call of ver runs in all, pessimistically; ok is
// false while too few calls finished to tell.
func (s *callStats) predictRun(ver function.Version) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.runs[poolKey(ver.Name, ver.Version)]
	if e == nil || e.n < minRunsToPredict {
		return 0, false
	}
	return e.high(), true
}

// predictCheckpoint is how long a checkpoint of a call of ver takes,
// pessimistically; a version never checkpointed gets a guess from its
// memory limit (dump and upload at 100 MB/s, plus a second).
func (s *callStats) predictCheckpoint(ver function.Version) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.ckpt[poolKey(ver.Name, ver.Version)]; e != nil {
		return e.high()
	}
	return time.Second + time.Duration(ver.MemoryMB)*10*time.Millisecond
}

// evictPlan is what an eviction does with one running call.
type evictPlan struct {
	rc       *runningCall
	memory   uint64        // its instance's, now
	finish   bool          // let it finish; moved only if it is still running at deadline
	deadline time.Duration // from the eviction's start; 0: no watchdog
	why      string        // why it is let finish
}

// Reasons a call is let finish on an evicted worker.
const (
	finishUnmovable = "cannot be checkpointed" // a forked instance (see wantsMovable)
	finishEnds      = "ends within the grace"  // its timeout (or slice) ends first
	finishPredicted = "predicted to end"       // its function's calls usually end in time
)

// plan decides, for each running call, to move it now or let it finish,
// and orders the moves. A call is let finish when it can only finish,
// when its timeout (or its slice's end, where it is checkpointed anyway)
// comes before the grace runs out, or when it is predicted to end with
// time left to move it should the prediction be wrong (R-Check's future
// work). Calls to move go smallest first: more of them fit in the grace.
func (s *callStats) plan(plans []evictPlan, grace time.Duration, now time.Time) []evictPlan {
	for i := range plans {
		p := &plans[i]
		rc := p.rc
		latest := grace - 2*s.predictCheckpoint(rc.ver)
		switch {
		case !rc.movable:
			p.finish, p.why = true, finishUnmovable
		case !rc.ends.IsZero() && rc.ends.Sub(now) < latest:
			p.finish, p.why = true, finishEnds
		default:
			if run, ok := s.predictRun(rc.ver); ok {
				left := run - rc.elapsed - now.Sub(rc.started)
				if left > 0 && left < latest {
					p.finish, p.deadline, p.why = true, latest, finishPredicted
				}
			}
		}
	}
	sort.SliceStable(plans, func(i, j int) bool {
		if plans[i].finish != plans[j].finish {
			return !plans[i].finish
		}
		return plans[i].memory < plans[j].memory
	})
	return plans
}

// maxConcurrentDumps bounds the checkpoints of running calls a worker
// takes at once (dumpQueue): CRIU and compression are CPU bound, and a
// smaller call that is done early is worth more than many done late.
const maxConcurrentDumps = 4

// Evict stops the worker taking calls, moves its running calls to other
// workers within grace (see plan), and then closes the worker. Calls it
// could not move by then are abandoned, and run again from the start
// elsewhere (sync ones sent again by their dispatcher, async ones given
// back to the queue); with no grace at all, every running call is. It
// returns what it did; Evicted is closed when it is over. Evict is
// idempotent.
func (w *Worker) Evict(ctx context.Context, grace time.Duration, why string) api.EvictReport {
	w.evictOnce.Do(func() { w.evictReport = w.evict(ctx, grace, why); close(w.evicted) })
	<-w.evicted
	return w.evictReport
}

// Evicted is closed once an eviction is over.
func (w *Worker) Evicted() <-chan struct{} { return w.evicted }

func (w *Worker) evict(ctx context.Context, grace time.Duration, why string) api.EvictReport {
	start := time.Now()
	deadline := start.Add(grace)
	rep := api.EvictReport{Worker: w.cfg.ID, Reason: why, GraceMS: grace.Milliseconds()}
	w.stopIntake()
	calls := w.runningCalls()
	rep.Running = len(calls)
	w.log.Warn("eviction: moving running calls to other workers", "reason", why, "grace", grace, "running", len(calls))
	plans := make([]evictPlan, len(calls))
	for i, rc := range calls {
		plans[i].rc = rc
		if st, err := rc.in.sb.Stats(); err == nil {
			plans[i].memory = st.MemoryBytes
		}
	}
	plans = w.stats.plan(plans, grace, start)
	if grace <= 0 {
		// No time to move anything: every running call is abandoned and
		// runs again from the start elsewhere (the re-run policy).
		plans = nil
	}
	// Every call to move is asked to leave now: each hands over as soon
	// as it can (between two bytecodes, with no socket open) and waits,
	// parked, for its turn to be dumped, smallest first (dumpQueue). A call
	// let finish whose prediction fails is asked later, and ranks after.
	for i, p := range plans {
		rc := p.rc
		if p.finish {
			rep.LetFinish++
			w.log.Info("eviction: letting a call finish", "fn", rc.ver.Name, "call", rc.id, "why", p.why)
			if p.deadline > 0 {
				// Should the prediction be wrong, move it while there is time.
				rc.order.Store(int64(len(plans) + i))
				t := time.AfterFunc(time.Until(start.Add(p.deadline)), func() { rc.leave(function.ReasonEviction) })
				go func() { <-rc.done; t.Stop() }()
			}
			continue
		}
		rep.Moving++
		rc.order.Store(int64(i))
		rc.leave(function.ReasonEviction)
	}
	// Close waits for every call to finish or move, until the deadline;
	// then it abandons the rest.
	dctx, cancel := context.WithDeadline(ctx, deadline)
	w.Close(dctx)
	cancel()
	rep.TookMS = time.Since(start).Milliseconds()
	for _, p := range plans {
		if p.rc.movedAs.Load() != nil {
			rep.Moved++
		}
	}
	w.log.Warn("eviction over", "reason", why, "running", rep.Running, "moved", rep.Moved, "let_finish", rep.LetFinish,
		"took", time.Since(start).Round(time.Millisecond))
	return rep
}

// handleEvict serves an eviction request for this worker: it answers at
// once with the plan's start, then evicts.
func (w *Worker) handleEvict(m *nats.Msg) {
	if id := m.Header.Get(callmsg.HWorker); id != "" && id != w.cfg.ID {
		return // for another worker whose id maps to the same subject
	}
	var req api.EvictRequest
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &req); err != nil {
			_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid("malformed evict request: " + err.Error())))
			return
		}
	}
	grace := w.cfg.EvictionGrace
	if req.GraceMS > 0 {
		grace = time.Duration(req.GraceMS) * time.Millisecond
	}
	if grace > 24*time.Hour {
		_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid(fmt.Sprintf("grace %s is too long: use at most 24h", grace))))
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = "evict request"
	}
	body, _ := json.Marshal(api.EvictReport{Worker: w.cfg.ID, Reason: reason, GraceMS: grace.Milliseconds(), Running: len(w.runningCalls())})
	_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
	go w.Evict(context.Background(), grace, reason)
}

// subscribeEvict listens for eviction requests addressed to this worker.
func (w *Worker) subscribeEvict() (*nats.Subscription, error) {
	sub, err := w.bus.NC.Subscribe(bus.EvictSubject(w.cfg.ID), w.handleEvict)
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe to eviction requests: %w", err)
	}
	return sub, nil
}
