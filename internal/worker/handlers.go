package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// handleSync serves one synchronous call and replies to the dispatcher.
func (w *Worker) handleSync(ctx context.Context, m *nats.Msg) {
	req, err := callmsg.ParseRequest(m)
	if err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	w.serveSync(ctx, req, func(res function.InvokeResult, err error) {
		reply := callmsg.Reply(res)
		if err != nil {
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
	w.wg.Add(1)
	defer w.wg.Done()
	w.serveSync(ctx, req, func(r function.InvokeResult, e error) { res, err = r, e })
	return res, err
}

// HasIdle implements dispatch.Local.
func (w *Worker) HasIdle(name string, version int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.idle[poolKey(name, version)]) > 0
}

// serveSync runs a sync call, hands the outcome to reply, then finishes the
// call's log and record off the caller's path.
func (w *Worker) serveSync(ctx context.Context, req function.InvokeRequest, reply func(function.InvokeResult, error)) {
	created := time.Now().UTC()
	res, closeLog, err := w.execute(ctx, req, w.cfg.QueueWait)
	if err != nil {
		w.log.Warn("call failed", "fn", req.Function, "call", req.CallID, "err", err)
		reply(res, err)
		return
	}
	reply(res, nil)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		closeLog()
		w.record(function.Call{ID: req.CallID, Function: req.Function, Version: res.Version, Mode: "sync",
			CreatedAt: created}, res, created)
	}()
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

func (w *Worker) recordWriter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-w.records:
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := w.calls.Put(wctx, c); err != nil {
				w.log.Warn("store call record", "call", c.ID, "err", err)
			}
			cancel()
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
	in, err := w.spawn(ctx, ver)
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

// asyncLoop takes async calls from the durable work queue, at most AsyncSlots
// at a time: a worker never holds calls it cannot start.
func (w *Worker) asyncLoop(ctx context.Context, cons jetstream.Consumer) {
	slots := make(chan struct{}, w.cfg.AsyncSlots)
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			<-slots
			if ctx.Err() == nil {
				w.log.Warn("fetch async calls", "err", err)
				time.Sleep(500 * time.Millisecond)
			}
			continue
		}
		got := false
		for msg := range batch.Messages() {
			got = true
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				defer func() { <-slots }()
				w.handleAsync(ctx, msg)
			}()
		}
		if !got {
			<-slots
		}
	}
}

var errAlreadyDone = errors.New("call already finished")

// handleAsync runs one queued call. The message is acknowledged only after
// the call's outcome is stored, so a worker that dies mid-call leaves it in
// the queue and JetStream delivers it again (at least once). A redelivered
// call whose record already holds an outcome is not run again.
func (w *Worker) handleAsync(ctx context.Context, msg jetstream.Msg) {
	m := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	req, err := callmsg.ParseRequest(m)
	if err != nil {
		w.log.Error("dropping malformed async message", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	log := w.log.With("fn", req.Function, "call", req.CallID)
	started := time.Now().UTC()
	_, err = w.calls.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		if c.Status == function.StatusSucceeded || c.Status == function.StatusFailed {
			return errAlreadyDone
		}
		for i := range c.Attempts {
			if c.Attempts[i].FinishedAt.IsZero() {
				c.Attempts[i].Outcome = "lost" // its worker died or gave up before finishing
			}
		}
		c.Status = function.StatusRunning
		c.Attempts = append(c.Attempts, function.Attempt{Worker: w.cfg.ID, StartedAt: started})
		return nil
	})
	switch {
	case errors.Is(err, errAlreadyDone):
		_ = msg.Ack()
		return
	case errors.Is(err, errdefs.ErrNotFound):
		log.Warn("async call has no record (expired?); running it anyway")
	case err != nil:
		log.Warn("mark call running", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}

	// Keep JetStream from redelivering while the call runs.
	hbCtx, stopHB := context.WithCancel(ctx)
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
	res, closeLog, err := w.execute(ctx, req, 0)
	closeLog()
	stopHB()
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			// The function or version is gone: the call can never run.
			res.Err = &function.Error{ErrorType: "ResourceNotFoundException", ErrorMessage: err.Error()}
		} else {
			log.Warn("async call not run; will retry", "err", err)
			_, _ = w.calls.Update(context.WithoutCancel(ctx), req.Function, req.CallID, func(c *function.Call) error {
				if n := len(c.Attempts); n > 0 {
					c.Attempts[n-1].FinishedAt, c.Attempts[n-1].Outcome = time.Now().UTC(), "retry: "+err.Error()
				}
				c.Status = function.StatusQueued
				return nil
			})
			_ = msg.NakWithDelay(2 * time.Second)
			return
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err = w.calls.Update(sctx, req.Function, req.CallID, func(c *function.Call) error {
		finish(c, res, w.cfg.ID, started)
		return nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		c := function.Call{ID: req.CallID, Function: req.Function, Version: res.Version, Mode: "async", CreatedAt: started}
		finish(&c, res, w.cfg.ID, started)
		err = w.calls.Put(sctx, c)
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
