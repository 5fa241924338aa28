package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// Calls on the move (R-Check, docs/migration.md). A call that runs on an
// instance the worker can checkpoint on its own is "movable": on an
// eviction, or when its slice ends before its max duration, the worker
// signals the agent, which hands the call over between two bytecodes of
// the handler; the worker dumps the instance into the snapshot store and
// publishes a resume message to the durable call queue; any worker takes
// it, restores the instance and collects the call's outcome, which goes to
// the caller as if nothing had happened.

// signalEvery is how often a call asked to leave is signalled again until
// its agent hands it over: a signal that lands between calls, or while the
// call holds a socket, is answered later or not at all.
const signalEvery = 5 * time.Millisecond

// maxDumpAttempts bounds the failed dumps of one call on one worker; the
// call then runs on where it is.
const maxDumpAttempts = 3

// runningCall is a call running on one of this worker's instances.
type runningCall struct {
	id      string
	in      *instance
	start   string // how this call's instance started for it (hot, cold, resume, ...)
	ver     function.Version
	started time.Time // this hop's start
	ends    time.Time // this hop's hard end: the slice's or the call's timeout
	elapsed time.Duration
	movable bool

	once    sync.Once
	leaveC  chan struct{}          // closed by leave
	reason  string                 // set by leave, before leaveC closes
	asked   time.Time              // set by leave
	armed   atomic.Bool            // the signal loop signals (false while a dump is in progress)
	order   atomic.Int64           // its turn among the checkpoints waiting to run (dumpQueue); an eviction sets it
	movedAs atomic.Pointer[string] // the snapshot it left as
	done    chan struct{}          // closed when the call is over here (finished or moved)
}

// deferral says why a call asked to leave never did.
func (rc *runningCall) deferral() string {
	return "its handler held an open socket, or ran in native code, until the end"
}

// leaving reports whether the call was asked to leave.
func (rc *runningCall) leaving() bool {
	select {
	case <-rc.leaveC:
		return true
	default:
		return false
	}
}

// rank is the call's turn among checkpoints waiting to run.
func (rc *runningCall) rank() int { return int(rc.order.Load()) }

// leave asks a movable call to leave this worker as a checkpoint; it
// reports whether the call can.
func (rc *runningCall) leave(reason string) bool {
	if !rc.movable {
		return false
	}
	rc.once.Do(func() {
		rc.reason, rc.asked = reason, time.Now()
		close(rc.leaveC)
	})
	return true
}

// movable reports whether calls on in can be checkpointed while they run:
// the worker takes snapshots and in runs in a PID namespace of its own (a
// forked instance shares its template's; see docs/templates.md).
func (w *Worker) movable(in *instance) bool { return w.snap != nil && in.tmpl == nil }

// wantsMovable reports whether instances of ver should start on their own,
// so that their calls can move: calls of a sliced function must, and so
// should calls that may outlive the shortest grace an eviction may give.
// Others are let finish within the grace and keep the fast fork path.
// With no grace at all nothing moves on an eviction: only sliced calls
// need to.
func (w *Worker) wantsMovable(ver function.Version) bool {
	grace := w.cfg.ShortestGrace
	return w.snap != nil && (ver.Sliced() || grace > 0 && ver.Timeout() > grace)
}

// startRunning registers a call running on in and, for a movable call,
// starts the loop that signals its agent once it is asked to leave.
func (w *Worker) startRunning(id string, in *instance, start string, ver function.Version, elapsed time.Duration, started, ends time.Time) *runningCall {
	rc := &runningCall{id: id, in: in, start: start, ver: ver, started: started, ends: ends, elapsed: elapsed, movable: w.movable(in),
		leaveC: make(chan struct{}), done: make(chan struct{})}
	rc.armed.Store(true)
	rc.order.Store(math.MaxInt32) // after an eviction's calls
	w.running.Store(id, rc)
	if rc.movable {
		go w.signalLoop(rc)
	}
	return rc
}

// stopRunning ends rc on this worker.
func (w *Worker) stopRunning(rc *runningCall) {
	w.running.CompareAndDelete(rc.id, rc)
	close(rc.done)
}

// signalLoop signals rc's agent, once rc is asked to leave, until the
// call is over here.
func (w *Worker) signalLoop(rc *runningCall) {
	select {
	case <-rc.leaveC:
	case <-rc.done:
		return
	}
	t := time.NewTicker(signalEvery)
	defer t.Stop()
	for {
		if rc.armed.Load() {
			if err := unix.Kill(rc.in.sb.Pid(), agentproto.CheckpointSignal); err != nil {
				return // the instance is gone: the call's Invoke says how
			}
		}
		select {
		case <-rc.done:
			return
		case <-t.C:
		}
	}
}

// runningCalls lists the calls running on this worker.
func (w *Worker) runningCalls() []*runningCall {
	var out []*runningCall
	w.running.Range(func(_, v any) bool {
		out = append(out, v.(*runningCall))
		return true
	})
	return out
}

// moved is execute's error for a call that left this worker as a
// snapshot; the caller hands it on with handOff.
type moved struct {
	snapshot string
	attempt  function.Attempt // this worker's hop, outcome checkpointed
	elapsed  time.Duration    // handler time so far, this hop included
	hop      int              // this move's number
}

func (m *moved) Error() string {
	return fmt.Sprintf("call moved as snapshot %s (%s)", m.snapshot, m.attempt.Reason)
}

// checkpointCall dumps the instance whose agent handed rc over and stores
// the image. On failure the instance still runs (CRIU lets it go).
func (w *Worker) checkpointCall(ctx context.Context, rc *runningCall, ck *agentproto.Checkpointed, hop int, ran time.Duration) (*moved, error) {
	cspec, labels := w.sandboxes.CheckpointSpec(rc.in.sb, rc.in.spec, false)
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["call"], labels["reason"] = rc.id, rc.reason
	t0 := time.Now()
	sres, err := w.snap.svc.Checkpoint(ctx, cspec, snapshot.Meta{Function: rc.ver.Name, Version: rc.ver.Version,
		Runtime: w.snap.runtime, MemoryBytes: ck.RSS, Labels: labels})
	if err != nil {
		return nil, err
	}
	// The record's checkpoint time counts from the request to leave, turns
	// waited included; the prediction learns the dump alone, which does
	// not depend on how many calls were moving with this one.
	w.stats.observeCheckpoint(rc.ver, time.Since(t0))
	took := time.Since(rc.asked)
	now := time.Now().UTC()
	return &moved{snapshot: sres.ID, elapsed: rc.elapsed + ran, hop: hop, attempt: function.Attempt{
		Worker: w.cfg.ID, Start: rc.start, StartedAt: rc.started.UTC(), FinishedAt: now,
		Outcome: function.OutcomeCheckpointed, Reason: rc.reason, Snapshot: sres.ID,
		RunMS: ms(ran), CheckpointMS: ms(took), ImageBytes: sres.Image.CompressedBytes,
	}}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// handOff records that the call left this worker and publishes it to the
// durable queue, where another worker (or this one, for a slice) takes it.
// For a sync call replyTo is where its caller waits for the outcome; it is
// told the call is moving once the call is in the queue (from then on the
// dispatcher never sends it again). Publishing is idempotent (one message
// per checkpoint), so a worker that finds the call's record moving can
// publish it again (republishMoved).
func (w *Worker) handOff(ctx context.Context, req function.InvokeRequest, mv *moved, mode, replyTo string, created time.Time) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := w.store.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		addAttempt(c, w.cfg.ID, mv.attempt)
		c.Status = function.StatusMoving
		return nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		c := function.Call{ID: req.CallID, Function: req.Function, Version: req.Version, Mode: mode,
			Status: function.StatusMoving, CreatedAt: created.UTC(), Attempts: []function.Attempt{mv.attempt}}
		err = w.store.Put(ctx, c)
	}
	if err != nil {
		// The record is the user's view; the call itself still moves.
		w.log.Warn("record the move of a call", "call", req.CallID, "err", err)
	}
	r := callmsg.Resume{Req: req, Snapshot: mv.snapshot, Mode: mode, ReplyTo: replyTo, Created: created,
		Elapsed: mv.elapsed, Hop: mv.hop, Reason: mv.attempt.Reason, From: w.cfg.ID}
	if err := w.publishResume(ctx, r); err != nil {
		return err
	}
	if mode == "sync" {
		_ = w.bus.NC.PublishMsg(noteTo(replyTo, callmsg.OutcomeMoving, w.cfg.ID))
	}
	w.metrics.moves.WithLabelValues(r.Reason).Inc()
	w.log.Info("call moved", "fn", req.Function, "call", req.CallID, "snapshot", mv.snapshot, "reason", r.Reason,
		"hop", r.Hop, "checkpoint_ms", mv.attempt.CheckpointMS, "image_bytes", mv.attempt.ImageBytes)
	return nil
}

// publishResume puts r in the durable queue, retrying until ctx ends.
func (w *Worker) publishResume(ctx context.Context, r callmsg.Resume) error {
	for try := 0; ; try++ {
		_, err := w.bus.JS.PublishMsg(ctx, callmsg.ResumeMsg(bus.SubjResume+r.Req.Function, r), jetstream.WithMsgID(r.MsgID()))
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("call %s is checkpointed as %s but could not be queued to resume: %v: %w",
				r.Req.CallID, r.Snapshot, err, errdefs.ErrUnavailable)
		}
		time.Sleep(time.Duration(min(try+1, 10)) * 100 * time.Millisecond)
	}
}

// failMoved records that a sync call checkpointed here could not be
// handed on: its caller gets err.
func (w *Worker) failMoved(ctx context.Context, req function.InvokeRequest, mv *moved, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, uerr := w.store.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		if c.Status == function.StatusMoving {
			c.Status, c.FinishedAt = function.StatusFailed, time.Now().UTC()
			c.Error = &function.Error{ErrorType: "ServiceException", ErrorMessage: err.Error()}
		}
		return nil
	})
	if uerr != nil && !errors.Is(uerr, errdefs.ErrNotFound) {
		w.log.Warn("record a move that failed", "call", req.CallID, "snapshot", mv.snapshot, "err", uerr)
	}
}

// republishMoved hands on again a call whose record says it is moving
// (its last checkpoint not yet resumed) when a message it came from is
// delivered again: the worker that moved it may have died before
// acknowledging that message, or before the resume message was queued.
// replyTo is a sync caller's subject, from that message. Republishing is
// idempotent (Resume.MsgID).
func (w *Worker) republishMoved(ctx context.Context, req function.InvokeRequest, c function.Call, replyTo string) error {
	r := callmsg.Resume{Req: req, Mode: c.Mode, ReplyTo: replyTo, Created: c.CreatedAt}
	for _, a := range c.Attempts {
		if a.Outcome == function.OutcomeCheckpointed {
			r.Hop++
			r.Elapsed += time.Duration(a.RunMS * float64(time.Millisecond))
			r.Snapshot, r.Reason, r.From = a.Snapshot, a.Reason, a.Worker
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return w.publishResume(ctx, r)
}

// addAttempt completes the attempt this worker opened (async calls and
// resumed ones open one when they start), or appends a.
func addAttempt(c *function.Call, worker string, a function.Attempt) {
	if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Worker == worker && c.Attempts[n-1].FinishedAt.IsZero() {
		a.StartedAt = c.Attempts[n-1].StartedAt
		a.RestoreMS = c.Attempts[n-1].RestoreMS // a resumed call's restore
		c.Attempts[n-1] = a
		return
	}
	c.Attempts = append(c.Attempts, a)
}

// awaitMoved waits on the inbox sub for the outcome of a sync call that
// moved while this process's dispatcher waited for it in-process. The
// workers the call moves through note their progress there first
// (running, moving); the call is durable in the queue meanwhile, so a
// resuming worker that dies only delays the outcome.
func awaitMoved(ctx context.Context, sub *nats.Subscription) (function.InvokeResult, error) {
	defer func() { _ = sub.Unsubscribe() }()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return function.InvokeResult{}, fmt.Errorf("waiting for the moved call's outcome: %v: %w", err, errdefs.ErrUnavailable)
		}
		if !callmsg.IsNote(m) {
			return callmsg.ParseReply(m)
		}
	}
}

// handleResume restores a call that another worker (or this one) checkpointed
// and finishes it: the outcome goes to the sync caller's inbox, or to the
// async call's record. The message is acknowledged once the outcome is
// delivered or the call moved on again, so a worker that dies meanwhile
// leaves it to the next (which restores the same snapshot again: from a
// crash, the part of the call after the checkpoint may run twice).
func (w *Worker) handleResume(ctx context.Context, msg jetstream.Msg) {
	m := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	r, err := callmsg.ParseResume(m)
	if err != nil {
		w.log.Error("dropping malformed resume message", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	log := w.log.With("fn", r.Req.Function, "call", r.Req.CallID, "snapshot", r.Snapshot, "hop", r.Hop)
	started := time.Now().UTC()
	failures := 0
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rec, err := w.store.Update(uctx, r.Req.Function, r.Req.CallID, func(c *function.Call) error {
		switch {
		case c.Status == function.StatusSucceeded || c.Status == function.StatusFailed:
			return errAlreadyDone
		case superseded(*c, r.Snapshot):
			return errMovedAway
		}
		failures = openAttempt(c, function.Attempt{Worker: w.cfg.ID, Start: function.StartResume, StartedAt: started, Snapshot: r.Snapshot})
		return nil
	})
	cancel()
	switch {
	case errors.Is(err, errAlreadyDone):
		_ = msg.Ack()
		return
	case errors.Is(err, errMovedAway):
		// A stale copy: this checkpoint was resumed and the call moved on
		// as a newer one. Should that one not be queued yet, queue it.
		if rec.Status == function.StatusMoving {
			if err := w.republishMoved(ctx, r.Req, rec, r.ReplyTo); err != nil {
				log.Warn("queue a moved call again", "err", err)
				_ = msg.NakWithDelay(time.Second)
				return
			}
		}
		log.Info("dropping a stale resume message: the call moved on from this checkpoint")
		_ = msg.Ack()
		return
	case err != nil:
		log.Warn("mark resumed call running", "err", err)
	}
	stopHB := w.heartbeat(ctx, msg)
	defer stopHB()
	if r.Mode == "sync" {
		note := noteTo(r.ReplyTo, callmsg.OutcomeRunning, w.cfg.ID)
		note.Header.Set(callmsg.HHop, strconv.Itoa(r.Hop)) // the dispatcher knows the call moved, whatever came first
		_ = w.bus.NC.PublishMsg(note)
	}
	res, closeLog, err := w.resume(ctx, r)
	closeLog()
	var mv *moved
	if errors.As(err, &mv) {
		if herr := w.handOff(ctx, r.Req, mv, r.Mode, r.ReplyTo, r.Created); herr != nil {
			// Its record names the new checkpoint: this message, delivered
			// again, queues that one (superseded, republishMoved).
			log.Error("moved call could not be queued again; will retry", "err", herr)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		_ = msg.Ack()
		return
	}
	if errors.Is(err, errAbandoned) {
		// The restored call was given up unfinished (this worker's grace
		// ran out, or a failed checkpoint took it): the next worker
		// restores the same checkpoint (the caller, if any, waits on).
		w.lostAttempt(ctx, r.Req, callmsg.AbandonReason(err))
		_ = msg.Nak()
		return
	}
	throttled, closing := errors.Is(err, errdefs.ErrThrottled), ctx.Err() != nil
	if err != nil && (throttled || closing || retryResume(err) && failures+1 < maxAsyncFailures) {
		// The checkpoint is intact: try again, here or elsewhere. Waiting
		// for memory, or a worker that goes away, is not a failure.
		if !throttled && !closing {
			log.Warn("resume failed; will retry", "err", err, "failures", failures+1)
		}
		w.retryAttempt(ctx, r.Req, err, function.StatusMoving)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err != nil {
		res.Err = &function.Error{ErrorType: "ServiceException", ErrorMessage: fmt.Sprintf("torpor could not resume the call: %v", err)}
	}
	w.finishRecord(ctx, function.Call{ID: r.Req.CallID, Function: r.Req.Function, Version: r.Req.Version, Mode: r.Mode,
		CreatedAt: r.Created}, res, started)
	w.answerResumed(ctx, r, res, err)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer scancel()
	if err := msg.DoubleAck(sctx); err != nil {
		log.Warn("ack resumed call", "err", err)
	}
}

// answerResumed sends a resumed sync call's outcome to its caller.
func (w *Worker) answerResumed(ctx context.Context, r callmsg.Resume, res function.InvokeResult, err error) {
	if r.Mode != "sync" {
		return
	}
	reply := callmsg.Reply(res)
	if err != nil {
		reply = callmsg.ErrorReply(err)
	}
	reply.Subject = r.ReplyTo
	if perr := w.bus.NC.PublishMsg(reply); perr != nil {
		w.log.Warn("reply to the caller of a moved call", "call", r.Req.CallID, "err", perr)
	}
}

// retryResume reports whether a resume that failed with err may succeed
// another time: anything but a checkpoint that is gone, refused (it fails
// verification), or not the call's, or a function version that is gone.
func retryResume(err error) bool {
	return !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrConflict)
}

// superseded reports whether snapshot, a checkpoint of c, is not its
// last: a later attempt checkpointed the call again. A resume message of
// it delivered again is stale.
func superseded(c function.Call, snapshot string) bool {
	at := -1
	for i, a := range c.Attempts {
		if a.Outcome != function.OutcomeCheckpointed {
			continue
		}
		if a.Snapshot == snapshot {
			at = i
		} else if at >= 0 {
			return true
		}
	}
	return false
}

// retryAttempt closes the attempt this worker opened on req's call, which
// failed with err before it could run, and leaves the call waiting in
// status for its next attempt. A platform failure is kept, as "retry:"
// (openAttempt counts them, and gives up after maxAsyncFailures); an
// attempt that only lacked room (err is ErrThrottled) or whose worker is
// going away (ctx is done) is no failure of the call, and is dropped.
func (w *Worker) retryAttempt(ctx context.Context, req function.InvokeRequest, err error, status string) {
	drop := errors.Is(err, errdefs.ErrThrottled) || ctx.Err() != nil
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, uerr := w.store.Update(uctx, req.Function, req.CallID, func(c *function.Call) error {
		if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Worker == w.cfg.ID && c.Attempts[n-1].FinishedAt.IsZero() {
			if drop {
				c.Attempts = c.Attempts[:n-1]
			} else {
				c.Attempts[n-1].FinishedAt, c.Attempts[n-1].Outcome = time.Now().UTC(), "retry: "+err.Error()
			}
		}
		c.Status = status
		return nil
	})
	if uerr != nil {
		w.log.Warn("record a call to retry", "call", req.CallID, "err", uerr)
	}
}

// heartbeat keeps JetStream from redelivering msg while its call runs.
func (w *Worker) heartbeat(ctx context.Context, msg jetstream.Msg) (stop func()) {
	hbCtx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(w.bus.AckWait() / 3)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return cancel
}

// resume restores r's snapshot and runs the call on to its end, or to its
// next move. A snapshot that cannot be restored fails the call: the state it
// held is gone.
func (w *Worker) resume(ctx context.Context, r callmsg.Resume) (function.InvokeResult, func(), error) {
	res := function.InvokeResult{CallID: r.Req.CallID, Version: r.Req.Version, Start: function.StartResume}
	if w.snap == nil {
		return res, noop, w.errNoSnapshots()
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ver, err := w.reg.ResolveWait(rctx, r.Req.Function, r.Req.Version)
	cancel()
	if err != nil {
		return res, noop, err
	}
	if err := w.reserve(ctx, ver.MemoryMB, asyncSlotWait); err != nil {
		return res, noop, err // throttled: another worker, or this one later
	}
	t0 := time.Now()
	in, resumed, err := w.restoreInstance(ctx, ver, r.Snapshot)
	if err != nil {
		w.unreserve(ver.MemoryMB)
		return res, noop, fmt.Errorf("restore snapshot %s of call %s: %w", r.Snapshot, r.Req.CallID, err)
	}
	in.start = function.StartResume
	res.StartTime = time.Since(t0)
	w.metrics.starts.WithLabelValues(function.StartResume).Observe(res.StartTime.Seconds())
	if resumed.InCall != r.Req.CallID {
		w.retire(in)
		return res, noop, fmt.Errorf("snapshot %s holds call %q, not %s: %w", r.Snapshot, resumed.InCall, r.Req.CallID, errdefs.ErrConflict)
	}
	w.setRestoreTime(r.Req, res.StartTime)
	logs := newCallLog(ver, r.Req.CallID)
	logs.platform(fmt.Sprintf("RESUME RequestId: %s Snapshot: %s From: %s Hop: %d Restore: %.2f ms",
		r.Req.CallID, r.Snapshot, r.From, r.Hop, ms(res.StartTime)))
	return w.run(ctx, ver, r.Req, in, res, logs, hopState{elapsed: r.Elapsed, n: r.Hop, resumed: true})
}

// lostAttempt closes the attempt this worker opened on req's call as lost.
func (w *Worker) lostAttempt(ctx context.Context, req function.InvokeRequest, reason string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := w.store.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Worker == w.cfg.ID && c.Attempts[n-1].FinishedAt.IsZero() {
			c.Attempts[n-1].FinishedAt, c.Attempts[n-1].Outcome, c.Attempts[n-1].Reason = time.Now().UTC(), function.OutcomeLost, reason
		}
		return nil
	})
	if err != nil {
		w.log.Warn("record a lost attempt", "call", req.CallID, "err", err)
	}
}

// setRestoreTime notes the restore time in the attempt handleResume opened.
func (w *Worker) setRestoreTime(req function.InvokeRequest, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := w.store.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Worker == w.cfg.ID {
			c.Attempts[n-1].RestoreMS = ms(d)
		}
		return nil
	})
	if err != nil {
		w.log.Debug("note restore time", "call", req.CallID, "err", err)
	}
}
