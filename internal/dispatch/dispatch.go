// Package dispatch is the control plane behind the gateway: it implements
// gateway.Backend on NATS JetStream. Deploys are validated by a worker and
// stored in the registry; synchronous calls go to a worker as NATS requests,
// to the one holding an idle instance or a template of the function when the
// worker directory names one; asynchronous calls are persisted in a JetStream
// work queue before they are acknowledged. It never runs function code itself.
package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/registry"
)

var _ gateway.Backend = (*Dispatcher)(nil)

// StartBudget is how long a call may wait for an instance on top of the
// function's own timeout before the dispatcher gives up on the worker.
const StartBudget = 30 * time.Second

// MoveBudget is added to a sync call's budget on top of StartBudget: a
// call that moves between workers waits for checkpoints and restores.
// A sliced call gets SliceBudget more for each slice end.
const (
	MoveBudget  = time.Minute
	SliceBudget = 10 * time.Second
)

// callBudget is how long a sync call of ver may take in all: its run time,
// a start, moves on an eviction, and a move at each slice end.
func callBudget(ver function.Version) time.Duration {
	b := ver.MaxDuration() + StartBudget + MoveBudget
	if ver.Sliced() && ver.Timeout() > 0 {
		slices := (ver.MaxDuration() + ver.Timeout() - 1) / ver.Timeout()
		b += time.Duration(slices) * SliceBudget
	}
	return b
}

// Local is a worker in the dispatcher's own process. A call that it can
// serve hot skips the NATS round trip; every other call goes through NATS,
// so placement across workers is unchanged.
type Local interface {
	// HasIdle reports whether an idle instance of the version is parked here.
	HasIdle(name string, version int) bool
	// ID is the worker's id, as in the worker directory.
	ID() string
	// Serve runs a call as a NATS-delivered one would be run.
	Serve(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error)
}

// Dispatcher implements gateway.Backend.
type Dispatcher struct {
	bus   *bus.Bus
	reg   *registry.Registry
	calls *callstore.Store
	local Local      // nil when no worker runs in this process
	dir   *Directory // nil: every call goes to the queue group
	log   *slog.Logger
}

// New returns a Dispatcher; local and dir may be nil.
func New(b *bus.Bus, reg *registry.Registry, calls *callstore.Store, local Local, dir *Directory, log *slog.Logger) *Dispatcher {
	return &Dispatcher{bus: b, reg: reg, calls: calls, local: local, dir: dir, log: log}
}

// Deploy implements gateway.Backend.
func (d *Dispatcher) Deploy(ctx context.Context, spec function.Spec, codeZip []byte) (function.Version, error) {
	if err := spec.Normalize(); err != nil {
		return function.Version{}, err
	}
	if len(codeZip) > function.MaxCodeZipBytes {
		return function.Version{}, errdefs.TooLarge(fmt.Sprintf("code package is %d bytes; the limit is %d bytes zipped", len(codeZip), function.MaxCodeZipBytes))
	}
	if _, err := codezip.Validate(codeZip); err != nil {
		return function.Version{}, fmt.Errorf("code package of %s: %w", spec.Name, err)
	}
	digest, stored, err := d.reg.PutCode(ctx, codeZip)
	if err != nil {
		return function.Version{}, err
	}
	ver, rev, err := d.reg.Prepare(ctx, spec, digest, int64(len(codeZip)))
	if err != nil {
		return function.Version{}, err
	}
	if err := d.validate(ctx, ver); err != nil {
		if stored { // a package that was already there may be another deploy's
			d.dropCode(context.WithoutCancel(ctx), digest)
		}
		return function.Version{}, err
	}
	if err := d.reg.Commit(ctx, ver, rev); err != nil {
		return function.Version{}, err
	}
	// Make the new version visible to this process's cache before answering,
	// so that an invoke right after the deploy runs it.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.reg.WaitVersion(wctx, ver.Name, ver.Version); err != nil {
		d.log.Warn("deployed version not yet visible to this gateway", "fn", ver.Name, "version", ver.Version, "err", err)
	}
	d.log.Info("deployed", "fn", ver.Name, "version", ver.Version, "code", digest[:12])
	return ver, nil
}

// dropCode deletes a code package no version uses any more. (The uid a
// deploy allocated stays reserved for the name, by design.)
func (d *Dispatcher) dropCode(ctx context.Context, digest string) {
	if d.reg.CodeInUse(digest) {
		return
	}
	if err := d.reg.DeleteCode(ctx, digest); err != nil {
		d.log.Warn("delete unused code package", "code", digest, "err", err)
	}
}

// validate asks a worker to start the version's code: a missing handler or a
// syntax error fails the deploy with the runtime's traceback.
func (d *Dispatcher) validate(ctx context.Context, ver function.Version) error {
	body, _ := json.Marshal(ver)
	msg := nats.NewMsg(bus.SubjValidate)
	msg.Data = body
	ctx, cancel := context.WithTimeout(ctx, StartBudget+time.Minute)
	defer cancel()
	reply, err := d.bus.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return requestError("validate "+ver.Name, err)
	}
	res, err := callmsg.ParseReply(reply)
	if err != nil {
		return fmt.Errorf("validate %s: %w", ver.Name, err)
	}
	if res.Err != nil {
		return errdefs.Invalid(fmt.Sprintf("deploy of %s rejected: the function failed to initialize: %s: %s\n%s",
			ver.Name, res.Err.ErrorType, res.Err.ErrorMessage, strings.Join(res.Err.StackTrace, "")))
	}
	return nil
}

func requestError(what string, err error) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%s: no worker is running: start one with `torpor up` or `torpor worker`: %w", what, errdefs.ErrUnavailable)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s: no answer from a worker in time: %w", what, errdefs.ErrTimeout)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", what, err)
	default:
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrUnavailable)
	}
}

// Function implements gateway.Backend.
func (d *Dispatcher) Function(_ context.Context, name string, v int) (function.Version, error) {
	if err := function.ValidateName(name); err != nil {
		return function.Version{}, err
	}
	return d.reg.Resolve(name, v)
}

// Functions implements gateway.Backend.
func (d *Dispatcher) Functions(context.Context) ([]function.Version, error) {
	return d.reg.Functions(), nil
}

// DeleteFunction implements gateway.Backend.
func (d *Dispatcher) DeleteFunction(ctx context.Context, name string) error {
	if err := function.ValidateName(name); err != nil {
		return err
	}
	old := d.reg.Versions(name)
	if err := d.reg.Delete(ctx, name); err != nil {
		return err
	}
	// Wait for this cache to drop the versions before checking code use.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = d.reg.WaitGone(wctx, name)
	for _, v := range old {
		d.dropCode(ctx, v.CodeDigest)
	}
	return nil
}

func (d *Dispatcher) resolve(req *function.InvokeRequest) (function.Version, error) {
	if err := function.ValidateName(req.Function); err != nil {
		return function.Version{}, err
	}
	if len(req.Payload) > function.MaxPayloadBytes {
		return function.Version{}, errdefs.TooLarge(fmt.Sprintf("payload of %d bytes exceeds the %d byte limit", len(req.Payload), function.MaxPayloadBytes))
	}
	ver, err := d.reg.Resolve(req.Function, req.Version)
	if err != nil {
		return ver, err
	}
	req.Version = ver.Version
	if req.CallID == "" {
		req.CallID = function.NewCallID()
	}
	return ver, nil
}

// Invoke implements gateway.Backend. A call goes, in order of preference,
// to this process's worker when it holds an idle instance of the version;
// to the worker the directory says holds one, or a template of it (see
// choose), served in-process when that is this process's worker; to any
// worker, through the queue group.
func (d *Dispatcher) Invoke(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error) {
	ver, err := d.resolve(&req)
	if err != nil {
		return function.InvokeResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, callBudget(ver))
	defer cancel()
	if d.local != nil && d.local.HasIdle(ver.Name, ver.Version) {
		res, err := d.local.Serve(ctx, req)
		if !d.leftLocal(ctx, &req, err) {
			return res, err
		}
		return d.invokeAny(ctx, req, ver, d.hintAnswered(ver))
	}
	done := func(string) {}
	if d.dir != nil {
		var worker string
		if worker, done = d.dir.place(ver.Name, ver.Version); worker != "" {
			if d.local != nil && worker == d.local.ID() {
				// Placed on this process's worker (its template, say):
				// no round trip through NATS.
				res, err := d.local.Serve(ctx, req)
				if !d.leftLocal(ctx, &req, err) {
					done(answeredBy(worker, res, err))
					return res, err
				}
				done("")
				return d.invokeAny(ctx, req, ver, d.hintAnswered(ver))
			}
			reply, by, err := d.request(ctx, bus.InvokeWorkerSubject(worker, req.Function), req)
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				// The worker is gone since its last summary; nothing ran.
				done("")
				d.log.Debug("placed worker is gone: any worker takes the call", "worker", worker, "fn", req.Function, "call", req.CallID)
				done = d.hintAnswered(ver)
			case err != nil:
				done("")
				return function.InvokeResult{}, requestError("call "+req.CallID+" of "+req.Function+" on worker "+worker, err)
			default:
				res, err := callmsg.ParseReply(reply)
				done(answeredBy(by, res, err))
				return res, err
			}
		}
	}
	return d.invokeAny(ctx, req, ver, done)
}

// hintAnswered is a done func for a call sent to any worker: the worker
// that answers it gets the version's next call.
func (d *Dispatcher) hintAnswered(ver function.Version) func(string) {
	if d.dir == nil {
		return func(string) {}
	}
	return func(by string) { d.dir.answered(ver.Name, ver.Version, by) }
}

// invokeAny sends the call to the queue group of all workers; done hears
// which worker answered.
func (d *Dispatcher) invokeAny(ctx context.Context, req function.InvokeRequest, ver function.Version, done func(string)) (function.InvokeResult, error) {
	reply, by, err := d.request(ctx, bus.SubjInvoke+req.Function, req)
	if err != nil {
		done("")
		return function.InvokeResult{}, requestError("call "+req.CallID+" of "+req.Function, err)
	}
	res, err := callmsg.ParseReply(reply)
	done(answeredBy(by, res, err))
	return res, err
}

// leftLocal reports whether this process's worker gave the call back with
// err: it is closing and did not start it, or it gave it up unfinished
// and without a checkpoint (an eviction's grace ran out), which the
// call's record then shows as a lost attempt. Either way the call goes to
// another worker through NATS, as the next attempt (request sends
// nothing once the caller has gone away).
func (d *Dispatcher) leftLocal(ctx context.Context, req *function.InvokeRequest, err error) bool {
	switch {
	case errors.Is(err, callmsg.ErrClosing):
		return true
	case errors.Is(err, callmsg.ErrAbandoned):
		d.log.Warn("this process's worker gave a call up without a checkpoint; running it again from the start", "call", req.CallID,
			"fn", req.Function, "worker", d.local.ID())
		d.recordLost(ctx, *req, function.Attempt{Worker: d.local.ID(), FinishedAt: time.Now().UTC(), Outcome: function.OutcomeLost,
			Reason: callmsg.AbandonReason(err)})
		req.Attempt = max(req.Attempt, 1)
		return true
	}
	return false
}

// answeredBy is the worker to hint for the next call of the version:
// worker, when the call came back healthy from it.
func answeredBy(worker string, res function.InvokeResult, err error) string {
	if err != nil || res.Err != nil {
		return ""
	}
	return worker
}

// maxCrashReruns bounds how often a sync call whose worker died is sent
// again.
const maxCrashReruns = 3

// deathCheck is how often the dispatcher looks whether the worker running
// a sync call died.
const deathCheck = time.Second

// request sends a sync call to subject and waits for its outcome. The
// worker that takes it notes so on the reply subject; should that worker
// die without a checkpoint (SIGKILL, a crash: the directory sees its entry
// go stale) or abandon the call (an eviction with no grace left), the call
// is recorded as lost there and sent again, to run from the start (at
// least once). A call that moved is in the durable queue and is never sent
// again. by is the worker that answered: the last to note it ran the call.
func (d *Dispatcher) request(ctx context.Context, subject string, req function.InvokeRequest) (reply *nats.Msg, by string, err error) {
	for attempt := req.Attempt + 1; ; attempt++ { // req.Attempt: those before, lost
		req.Attempt = attempt
		if err := ctx.Err(); err != nil { // nobody would read the answer
			return nil, "", err
		}
		inbox := d.bus.NC.NewRespInbox()
		sub, err := d.bus.NC.SubscribeSync(inbox)
		if err != nil {
			return nil, "", err
		}
		msg := callmsg.Request(subject, req)
		msg.Reply = inbox
		if err := d.bus.NC.PublishMsg(msg); err != nil {
			_ = sub.Unsubscribe()
			return nil, "", err
		}
		reply, lost, by, err := d.await(ctx, sub)
		_ = sub.Unsubscribe()
		if err != nil || lost.Worker == "" {
			return reply, by, err
		}
		d.log.Warn("the worker running a call went away without a checkpoint; running it again from the start", "call", req.CallID,
			"fn", req.Function, "worker", lost.Worker, "reason", lost.Reason, "attempt", attempt)
		d.recordLost(ctx, req, lost)
		if attempt > maxCrashReruns {
			return nil, "", fmt.Errorf("call %s: %d workers died running it: %w", req.CallID, attempt, errdefs.ErrUnavailable)
		}
		subject = bus.SubjInvoke + req.Function // any worker
	}
}

// await reads sub until the call's outcome arrives, or its worker dies or
// abandons it: lost is then that attempt (outcome lost), and the call
// runs again. worker is the last worker that noted it runs the call.
func (d *Dispatcher) await(ctx context.Context, sub *nats.Subscription) (reply *nats.Msg, lost function.Attempt, worker string, err error) {
	var since time.Time
	// Once the call has moved it is durable in the queue: a worker that
	// resumes it and dies leaves it to the next, from the checkpoint, so
	// it is never sent again from the start.
	moved := false
	gone := func(reason string) function.Attempt {
		return function.Attempt{Worker: worker, StartedAt: since, FinishedAt: time.Now().UTC(), Outcome: function.OutcomeLost, Reason: reason}
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, deathCheck)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, lost, worker, ctx.Err()
		case errors.Is(err, nats.ErrNoResponders):
			return nil, lost, worker, err
		case err != nil:
			if worker != "" && !moved && d.dir != nil && d.dir.Dead(worker) {
				return nil, gone(function.ReasonCrash), worker, nil
			}
			continue
		case m.Header.Get("Status") == "503":
			return nil, lost, worker, nats.ErrNoResponders
		case !callmsg.IsNote(m):
			return m, lost, worker, nil
		}
		switch m.Header.Get(callmsg.HOutcome) {
		case callmsg.OutcomeRunning:
			worker, since = m.Header.Get(callmsg.HWorker), time.Now().UTC()
			if m.Header.Get(callmsg.HHop) != "" {
				moved = true // resumed from a checkpoint, whether or not the moving note came first
			}
		case callmsg.OutcomeAbandoned:
			if !moved {
				worker = m.Header.Get(callmsg.HWorker)
				return nil, gone(cmp.Or(m.Header.Get(callmsg.HReason), function.ReasonEviction)), worker, nil
			}
		default: // moving: the call is in the durable queue
			moved = true
		}
	}
}

// recordLost notes in the call's record the attempt that was lost.
func (d *Dispatcher) recordLost(ctx context.Context, req function.InvokeRequest, lost function.Attempt) {
	now := time.Now().UTC()
	_, err := d.calls.Update(ctx, req.Function, req.CallID, func(c *function.Call) error {
		c.Attempts = append(c.Attempts, lost)
		return nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		err = d.calls.Put(ctx, function.Call{ID: req.CallID, Function: req.Function, Version: req.Version, Mode: "sync",
			Status: function.StatusRunning, CreatedAt: now, Attempts: []function.Attempt{lost}})
	}
	if err != nil {
		d.log.Warn("record a lost attempt", "call", req.CallID, "err", err)
	}
}

// InvokeAsync implements gateway.Backend. The call is in JetStream (and so
// survives any process dying) before this returns.
func (d *Dispatcher) InvokeAsync(ctx context.Context, req function.InvokeRequest) (function.Call, error) {
	ver, err := d.resolve(&req)
	if err != nil {
		return function.Call{}, err
	}
	c := function.Call{ID: req.CallID, Function: ver.Name, Version: ver.Version, Mode: "async",
		Status: function.StatusQueued, CreatedAt: time.Now().UTC()}
	if err := d.calls.Create(ctx, c); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			// A retry of an accepted call (same id): it is already queued
			// or done; answer with its record, never run it twice.
			return d.calls.Get(ctx, req.CallID)
		}
		return c, fmt.Errorf("accept async call: %v: %w", err, errdefs.ErrUnavailable)
	}
	msg := callmsg.Request(bus.SubjCalls+req.Function, req)
	if _, err := d.bus.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(req.CallID)); err != nil {
		// Not accepted: drop the record. Should the publish have landed after
		// all, the worker that runs it writes a new record.
		_ = d.calls.Delete(context.WithoutCancel(ctx), c.Function, c.ID)
		return c, fmt.Errorf("enqueue call %s: %v: %w", req.CallID, err, errdefs.ErrUnavailable)
	}
	return c, nil
}

// Call implements gateway.Backend.
func (d *Dispatcher) Call(ctx context.Context, id string) (function.Call, error) {
	return d.calls.Get(ctx, id)
}

// Calls implements gateway.Backend.
func (d *Dispatcher) Calls(ctx context.Context, name string, limit int) ([]function.Call, error) {
	if err := function.ValidateName(name); err != nil {
		return nil, err
	}
	// As for Logs: the calls of a function that does not exist (any more)
	// are not listed; GET /v1/calls/{id} still finds each record.
	if _, err := d.reg.Resolve(name, 0); err != nil {
		return nil, err
	}
	return d.calls.List(ctx, name, limit)
}

// Logs implements gateway.Backend.
func (d *Dispatcher) Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error {
	if err := function.ValidateName(name); err != nil {
		return err
	}
	if _, err := d.reg.Resolve(name, 0); err != nil && !follow {
		return err
	}
	cons, err := d.bus.JS.OrderedConsumer(ctx, bus.StreamLogs, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjLogs + name},
		// Gone soon after the reader leaves, rather than after the default 5 min.
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("read logs of %s: %w", name, err)
	}
	defer func() {
		// Ordered consumers are ephemeral; remove this one now rather than
		// when the server notices it is idle.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = d.bus.JS.DeleteConsumer(dctx, bus.StreamLogs, info.Name)
			cancel()
		}
	}()
	if !follow {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("read logs of %s: %w", name, err)
		}
		if info.NumPending == 0 {
			return nil
		}
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				if follow {
					return nil
				}
				return ctx.Err()
			}
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
				continue
			}
			return fmt.Errorf("read logs of %s: %w", name, err)
		}
		var lines []function.LogLine
		if err := json.Unmarshal(msg.Data(), &lines); err != nil {
			d.log.Warn("corrupt log batch", "fn", name, "err", err)
		}
		for _, l := range lines {
			if err := fn(l); err != nil {
				return err
			}
		}
		if !follow {
			if md, err := msg.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
	}
}
