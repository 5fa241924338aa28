package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/function"
)

// directoryDebounce gathers a burst of changes (a call takes an idle
// instance, parks it again, the next call takes it) into one put.
const directoryDebounce = 100 * time.Millisecond

// publishLoop keeps this worker's entry in the worker directory
// (bus.BucketWorkers) current, so that dispatchers place calls where an
// instance or a template of the function already is: it puts the worker's
// Summary whenever what it holds changes (debounced) and at least every
// bus.WorkerRefresh, and deletes the entry when ctx ends, so that a worker
// that shuts down cleanly leaves the directory at once rather than after
// bus.WorkerTTL.
func (w *Worker) publishLoop(ctx context.Context) {
	key := bus.WorkerKey(w.cfg.ID)
	tick := time.NewTicker(bus.WorkerRefresh)
	defer tick.Stop()
	var last api.WorkerSummary
	failing := false
	publish := func(onlyIfChanged bool) {
		s := w.Summary()
		if onlyIfChanged && sameHoldings(last, s) {
			return
		}
		err := w.putSummary(ctx, key, s)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			w.log.Warn("publish to the worker directory failed: calls are placed without this worker's holdings until it works again", "err", err)
		case err == nil && failing:
			w.log.Info("publishing to the worker directory again")
		}
		failing = err != nil
		if err == nil {
			last = s
		}
	}
	changed := w.Changed()
	publish(false)
	for {
		onlyIfChanged := true
		select {
		case <-tick.C:
			onlyIfChanged = false
		case <-changed:
			select {
			case <-time.After(directoryDebounce):
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			w.unpublish(ctx, key)
			return
		}
		// Take the next channel before reading the summary, so that a
		// change after the read wakes the loop again.
		changed = w.Changed()
		publish(onlyIfChanged)
	}
}

// sameHoldings reports whether a and b tell a dispatcher the same thing.
func sameHoldings(a, b api.WorkerSummary) bool {
	return a.ID == b.ID && a.ReservedMB == b.ReservedMB && a.Running == b.Running && a.Draining == b.Draining &&
		slices.Equal(a.Holdings, b.Holdings)
}

func (w *Worker) putSummary(ctx context.Context, key string, s api.WorkerSummary) error {
	body, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, bus.WorkerRefresh)
	defer cancel()
	if _, err := w.bus.Workers.Put(ctx, key, body); err != nil {
		return fmt.Errorf("put %s in %s: %w", key, bus.BucketWorkers, err)
	}
	return nil
}

// unpublish deletes this worker's directory entry (ctx is already done).
func (w *Worker) unpublish(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := w.bus.Workers.Delete(ctx, key); err != nil {
		w.log.Warn("leave the worker directory: the entry expires by itself", "ttl", bus.WorkerTTL, "err", err)
	}
}

// subscribeDirectory subscribes to the requests addressed to this worker by
// what the directory says of it: synchronous calls placed on it (as the
// queue group's, under callCtx), info requests, and the broadcast drop
// requests. Each is run as a tracked call, so Close waits for it.
func (w *Worker) subscribeDirectory(callCtx context.Context) ([]*nats.Subscription, error) {
	tracked := func(h func(*nats.Msg)) nats.MsgHandler {
		return func(m *nats.Msg) {
			if !w.track(func() { h(m) }) {
				_ = m.RespondMsg(callmsg.ErrorReply(errShuttingDown(w.cfg.ID)))
			}
		}
	}
	subs := []struct {
		subject string
		queue   string // "" for a broadcast every worker answers
		handle  func(*nats.Msg)
	}{
		// The queue group guards against two workers started with one id:
		// a call still runs once.
		{bus.InvokeWorkerSubject(w.cfg.ID, "*"), bus.Workers, func(m *nats.Msg) { w.handleSync(callCtx, m) }},
		{bus.WorkerInfoSubject(w.cfg.ID), bus.Workers, w.handleInfo},
		{bus.SubjDrop, "", w.handleDrop},
	}
	var out []*nats.Subscription
	for _, s := range subs {
		// With no queue group, QueueSubscribe is a plain subscription.
		sub, err := w.bus.NC.QueueSubscribe(s.subject, s.queue, tracked(s.handle))
		if err != nil {
			for _, o := range out {
				_ = o.Unsubscribe()
			}
			return nil, fmt.Errorf("worker: subscribe to %s: %w", s.subject, err)
		}
		out = append(out, sub)
	}
	return out, nil
}

// handleInfo answers an info request with the worker's api.WorkerInfo.
func (w *Worker) handleInfo(m *nats.Msg) {
	body, err := json.Marshal(w.Info())
	if err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(fmt.Errorf("worker %s: encode info: %w", w.cfg.ID, err)))
		return
	}
	_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
}

// handleDrop stops what the worker keeps of a function, on request, and
// answers with what it stopped.
func (w *Worker) handleDrop(m *nats.Msg) {
	d, err := callmsg.ParseDrop(m)
	if err != nil {
		_ = m.RespondMsg(callmsg.ErrorReply(err))
		return
	}
	res := w.Drop(d.Function, d.Version, d.KeepTemplates)
	w.log.Info("dropped on request", "fn", d.Function, "version", d.Version, "keep_templates", d.KeepTemplates,
		"instances", res.Instances, "templates", res.Templates)
	body, _ := json.Marshal(res) // a struct of ints: cannot fail
	_ = m.RespondMsg(callmsg.Reply(function.InvokeResult{Payload: body}))
}
