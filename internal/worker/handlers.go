package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// handleSync serves one synchronous call and replies to the dispatcher.
func (w *Worker) handleSync(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		w.log.Warn("dropping a sync call without a reply subject: nobody waits for it", "subject", m.Subject)
		return
	}
	req, err := callmsg.ParseRequest(m)
	if err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	// Tell the dispatcher who runs the call: should this worker die, it
	// sends the call again.
	_ = m.RespondMsg(callmsg.Note(callmsg.OutcomeRunning, w.cfg.ID))
	w.serveSync(ctx, req, m.Reply, func(res function.InvokeResult, err error) {
		reply := callmsg.Reply(res)
		switch {
		case errors.Is(err, errAbandoned):
			// The dispatcher runs it again elsewhere, as for a crash.
			reply = callmsg.Note(callmsg.OutcomeAbandoned, w.cfg.ID)
			reply.Header.Set(callmsg.HReason, callmsg.AbandonReason(err))
		case err != nil:
			reply = callmsg.ErrorReply(err)
		}
		if rerr := m.RespondMsg(reply); rerr != nil {
			w.log.Warn("reply lost", "fn", req.Function, "call", req.CallID, "err", rerr)
		}
	})
}

// Serve implements dispatch.Local: the same path as a call from NATS,
// answered in-process.
func (w *Worker) Serve(ctx context.Context, req function.InvokeRequest) (res function.InvokeResult, err error) {
	w.closeMu.RLock()
	if w.closing {
		w.closeMu.RUnlock()
		return res, errShuttingDown(w.cfg.ID)
	}
	w.calls.Add(1)
	w.closeMu.RUnlock()
	// The call runs until its caller goes away or, as a call from NATS
	// does, until the worker gives up on its calls (run tells the two
	// apart). Waiting for a moved call's outcome is the caller's alone.
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(w.callCtx, cancel)
	await := w.serveSync(cctx, req, "", func(r function.InvokeResult, e error) { res, err = r, e })
	stop()
	cancel()
	// A call that moved runs on another worker: waiting for its outcome
	// is not a call running here, and must not hold up an eviction.
	w.calls.Done()
	if await != nil {
		return awaitMoved(ctx, await)
	}
	return res, err
}

// ID implements dispatch.Local.
func (w *Worker) ID() string { return w.cfg.ID }

// HasIdle implements dispatch.Local.
func (w *Worker) HasIdle(name string, version int) bool {
	w.closeMu.RLock()
	closing := w.closing
	w.closeMu.RUnlock()
	if closing { // evicted or shutting down: calls go to other workers
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.idle[poolKey(name, version)]) > 0
}

// serveSync runs a sync call, hands the outcome to reply, then finishes the
// call's log and record off the caller's path. A call that moves to
// another worker is answered by that worker, on replyTo; with no replyTo
// (an in-process caller) serveSync returns the subscription on which the
// answer will arrive (see awaitMoved), and does not call reply.
func (w *Worker) serveSync(ctx context.Context, req function.InvokeRequest, replyTo string, reply func(function.InvokeResult, error)) (await *nats.Subscription) {
	created := time.Now().UTC()
	res, closeLog, err := w.execute(ctx, req, w.cfg.QueueWait)
	var mv *moved
	if errors.As(err, &mv) {
		var sub *nats.Subscription
		if replyTo == "" {
			replyTo = w.bus.NC.NewRespInbox()
			if sub, err = w.bus.NC.SubscribeSync(replyTo); err != nil {
				w.failMoved(ctx, req, mv, err)
				reply(res, fmt.Errorf("call %s moved, but waiting for its outcome failed: %v: %w", req.CallID, err, errdefs.ErrUnavailable))
				return nil
			}
		}
		if err := w.handOff(ctx, req, mv, "sync", replyTo, created); err != nil {
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			w.failMoved(ctx, req, mv, err)
			reply(res, err)
			return nil
		}
		return sub // the worker that finishes the call answers the caller
	}
	if err != nil {
		w.log.Warn("call failed", "fn", req.Function, "call", req.CallID, "err", err)
		reply(res, err)
		return nil
	}
	reply(res, nil)
	// Counted as part of the call (the call's own count is still held), so
	// that Close writes the record before the worker goes away.
	w.calls.Add(1)
	go func() {
		defer w.calls.Done()
		closeLog()
		c := function.Call{ID: req.CallID, Function: req.Function, Version: res.Version, Mode: "sync", CreatedAt: created}
		if req.Attempt > 1 {
			// A re-run after a crash: keep the lost attempts on record.
			w.finishRecord(ctx, c, res, created)
			return
		}
		w.record(c, res, created)
	}()
	return nil
}

// record queues the record of a finished sync call; the write happens off the
// call path. Under overload records are dropped (and counted), never calls.
func (w *Worker) record(c function.Call, res function.InvokeResult, started time.Time) {
	finish(&c, res, w.cfg.ID, started)
	select {
	case w.records <- c:
	default:
		w.metrics.droppedRecords.Inc()
	}
}

// finishRecord stores the outcome of a call whose record may hold earlier
// attempts (a re-run, a resumed call).
func (w *Worker) finishRecord(ctx context.Context, c function.Call, res function.InvokeResult, started time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := w.store.Update(ctx, c.Function, c.ID, func(old *function.Call) error {
		finish(old, res, w.cfg.ID, started)
		return nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		finish(&c, res, w.cfg.ID, started)
		err = w.store.Put(ctx, c)
	}
	if err != nil {
		w.log.Warn("store call record", "call", c.ID, "err", err)
	}
}

// noteTo is a progress note addressed to a sync caller's reply subject.
func noteTo(subject, outcome, worker string) *nats.Msg {
	m := callmsg.Note(outcome, worker)
	m.Subject = subject
	return m
}

// recordWriter stores queued records until Close, then flushes the rest.
func (w *Worker) recordWriter() {
	defer close(w.recordsDone)
	put := func(c function.Call) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.store.Put(ctx, c); err != nil {
			w.log.Warn("store call record", "call", c.ID, "err", err)
		}
	}
	for {
		select {
		case c := <-w.records:
			put(c)
		case <-w.stopRecord:
			for {
				select {
				case c := <-w.records:
					put(c)
				default:
					return
				}
			}
		}
	}
}

// finish fills a record from a result.
func finish(c *function.Call, res function.InvokeResult, worker string, started time.Time) {
	now := time.Now().UTC()
	c.FinishedAt = now
	c.DurationMS = float64(res.Duration.Microseconds()) / 1000
	outcome := function.StatusSucceeded
	if res.Err != nil {
		outcome = function.StatusFailed
		c.Error = res.Err
		c.Result = nil
	} else {
		c.Result = json.RawMessage(res.Payload)
		c.Error = nil
	}
	c.Status = outcome
	if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Worker == worker && c.Attempts[n-1].FinishedAt.IsZero() {
		c.Attempts[n-1].FinishedAt, c.Attempts[n-1].Outcome, c.Attempts[n-1].Start = now, outcome, res.Start
	} else {
		c.Attempts = append(c.Attempts, function.Attempt{Worker: worker, Start: res.Start, StartedAt: started,
			FinishedAt: now, Outcome: outcome})
	}
}

// handleValidate starts a new version's code once, so that a deploy whose
// code cannot load is rejected with the runtime's traceback. The instance is
// kept: the version's first call finds it hot.
func (w *Worker) handleValidate(ctx context.Context, m *nats.Msg) {
	var ver function.Version
	if err := json.Unmarshal(m.Data, &ver); err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid("malformed validation request: " + err.Error())))
		return
	}
	if err := w.reserve(ctx, ver.MemoryMB, w.cfg.QueueWait); err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	in, _, err := w.startNew(ctx, ver)
	if err != nil {
		w.unreserve(ver.MemoryMB)
		var ie *agentproto.InitError
		if errors.As(err, &ie) {
			fe := ie.Err
			_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Version: ver.Version, Err: &fe}))
			return
		}
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	w.release(in)
	_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Version: ver.Version, Start: function.StartCold, Payload: []byte("null")}))
}

// handleSnapshot takes a snapshot of an instance on request (torpor
// snapshot create); the result travels as the payload of a call reply.
func (w *Worker) handleSnapshot(ctx context.Context, m *nats.Msg) {
	var req api.SnapshotCreate
	if err := json.Unmarshal(m.Data, &req); err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(errdefs.Invalid("malformed snapshot request: " + err.Error())))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	res, err := w.Snapshot(ctx, req)
	if err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	body, _ := json.Marshal(res)
	_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Version: res.Version, Payload: body}))
}

// asyncLoop takes async calls from the durable work queue, at most AsyncSlots
// at a time: a worker never holds calls it cannot start. It stops fetching
// when loopCtx ends; the calls themselves run under callCtx.
func (w *Worker) asyncLoop(loopCtx, callCtx context.Context, cons jetstream.Consumer) {
	slots := make(chan struct{}, w.cfg.AsyncSlots)
	for loopCtx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-loopCtx.Done():
			return
		}
		// A bounded fetch under loopCtx: shutdown does not wait it out.
		fctx, cancel := context.WithTimeout(loopCtx, 2*time.Second)
		batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			<-slots
			if loopCtx.Err() == nil {
				w.log.Warn("fetch async calls", "err", err)
				select {
				case <-time.After(500 * time.Millisecond):
				case <-loopCtx.Done():
				}
			}
			continue
		}
		got := false
		for msg := range batch.Messages() {
			got = true
			if !w.track(func() {
				defer func() { <-slots }()
				w.handleAsync(callCtx, msg)
			}) {
				<-slots
				_ = msg.Nak() // closing: let another worker take it now
			}
		}
		cancel()
		if !got {
			<-slots
		}
	}
}

var (
	errAlreadyDone = errors.New("call already finished")
	errMovedAway   = errors.New("call moved on as a checkpoint")
)

// movedAway reports whether c went on as a checkpoint at some point: from
// then on it lives in the resume queue, and a copy of the message that
// first started it is stale.
func movedAway(c function.Call) bool {
	return slices.ContainsFunc(c.Attempts, func(a function.Attempt) bool { return a.Outcome == function.OutcomeCheckpointed })
}

// Async retry policy.
const (
	// asyncSlotWait bounds how long an async call waits for a concurrency
	// slot or memory before it goes back to the queue, so that one
	// function's backlog never holds every async slot of the worker.
	asyncSlotWait = 2 * time.Second
	// maxAsyncFailures is how many platform failures (sandbox or code
	// fetch errors, ...) a call may meet before it fails for good.
	maxAsyncFailures = 5
)

// handleAsync runs one queued call. The message is acknowledged only after
// the call's outcome is stored, so a worker that dies mid-call leaves it in
// the queue and JetStream delivers it again (at least once). A redelivered
// call whose record already holds an outcome is not run again.
func (w *Worker) handleAsync(ctx context.Context, msg jetstream.Msg) {
	m := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	if strings.HasPrefix(m.Subject, bus.SubjResume) {
		w.handleResume(ctx, msg)
		return
	}
	req, err := callmsg.ParseRequest(m)
	if err != nil {
		w.log.Error("dropping malformed async message", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	log := w.log.With("fn", req.Function, "call", req.CallID)
	started := time.Now().UTC()
	failures := 0
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rec, err := w.store.Update(uctx, req.Function, req.CallID, func(c *function.Call) error {
		switch {
		case c.Status == function.StatusSucceeded || c.Status == function.StatusFailed:
			return errAlreadyDone
		case movedAway(*c):
			return errMovedAway
		}
		failures = openAttempt(c, function.Attempt{Worker: w.cfg.ID, StartedAt: started})
		return nil
	})
	cancel()
	switch {
	case errors.Is(err, errAlreadyDone):
		_ = msg.Ack()
		return
	case errors.Is(err, errMovedAway):
		// A stale copy: the call went on as a checkpoint, which the resume
		// queue holds (or a worker runs). Should the worker that moved it
		// have died before queueing it, queue it now (idempotent).
		if rec.Status == function.StatusMoving {
			if err := w.republishMoved(ctx, req, rec, ""); err != nil {
				log.Warn("queue a moved call again", "err", err)
				_ = msg.NakWithDelay(time.Second)
				return
			}
		}
		_ = msg.Ack()
		return
	case errors.Is(err, errdefs.ErrNotFound):
		log.Warn("async call has no record (expired?); running it anyway")
	case err != nil:
		log.Warn("mark call running", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}

	// Keep JetStream from redelivering while the call runs, and until its
	// outcome or its move is stored.
	stopHB := w.heartbeat(ctx, msg)
	defer stopHB()
	res, closeLog, err := w.execute(ctx, req, asyncSlotWait)
	closeLog()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer scancel()
	var mv *moved
	if errors.As(err, &mv) {
		if herr := w.handOff(ctx, req, mv, "async", "", started); herr != nil {
			// Its record names the checkpoint: this message, delivered
			// again, queues it (movedAway, republishMoved).
			log.Error("moved call could not be queued; will retry", "err", herr)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		if err := msg.DoubleAck(sctx); err != nil {
			log.Warn("ack moved async call", "err", err)
		}
		return
	}
	if errors.Is(err, errAbandoned) {
		// Not a failure of the call: it runs again from the start, on
		// whichever worker takes it next.
		w.lostAttempt(ctx, req, callmsg.AbandonReason(err))
		_ = msg.Nak()
		return
	}
	if err != nil {
		closing := ctx.Err() != nil // not run because this worker is going away: another runs it
		if ferr := finalAsyncError(err, failures+1); ferr != nil && !closing {
			res.Err = ferr
		} else {
			if !closing && !errors.Is(err, errdefs.ErrThrottled) {
				log.Warn("async call not run; will retry", "err", err)
			}
			w.retryAttempt(ctx, req, err, function.StatusQueued)
			_ = msg.NakWithDelay(time.Second)
			return
		}
	}
	_, err = w.store.Update(sctx, req.Function, req.CallID, func(c *function.Call) error {
		finish(c, res, w.cfg.ID, started)
		return nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		c := function.Call{ID: req.CallID, Function: req.Function, Version: res.Version, Mode: "async", CreatedAt: started}
		finish(&c, res, w.cfg.ID, started)
		err = w.store.Put(sctx, c)
	}
	if err != nil {
		log.Error("store async result; the call will run again", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err := msg.DoubleAck(sctx); err != nil {
		log.Warn("ack async call", "err", fmt.Errorf("ack: %w", err))
	}
}

// openAttempt starts attempt a of call c: an earlier attempt left
// unfinished lost its worker (a crash), and the call runs again. It
// returns how many attempts failed for the platform (retries).
func openAttempt(c *function.Call, a function.Attempt) (failures int) {
	for i := range c.Attempts {
		if c.Attempts[i].FinishedAt.IsZero() {
			c.Attempts[i].Outcome, c.Attempts[i].Reason = function.OutcomeLost, function.ReasonCrash
		}
		if strings.HasPrefix(c.Attempts[i].Outcome, "retry:") {
			failures++
		}
	}
	c.Status = function.StatusRunning
	c.Attempts = append(c.Attempts, a)
	return failures
}

// finalAsyncError decides whether a platform error ends an async call: a
// missing function or version, a request that can never succeed, or too
// many failures. It returns the error to record, or nil to retry.
func finalAsyncError(err error, failures int) *function.Error {
	switch {
	case errors.Is(err, errdefs.ErrThrottled):
		return nil
	case errors.Is(err, errdefs.ErrNotFound):
		return &function.Error{ErrorType: "ResourceNotFoundException", ErrorMessage: err.Error()}
	case errors.Is(err, errdefs.ErrInvalid), errors.Is(err, errdefs.ErrTooLarge):
		return &function.Error{ErrorType: "InvalidParameterValueException", ErrorMessage: err.Error()}
	case failures >= maxAsyncFailures:
		return &function.Error{ErrorType: "ServiceException",
			ErrorMessage: fmt.Sprintf("torpor could not run the call after %d attempts: %v", failures, err)}
	}
	return nil
}
