package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
)

// DropWait bounds how long a drop request waits for the workers' answers.
const DropWait = 2 * time.Second

// Limits of an eviction request.
const (
	MaxEvictGrace     = 24 * time.Hour
	MaxEvictReasonLen = 200 // characters
)

// idleHint is how long this dispatcher takes a worker that has just
// answered a call to hold an idle instance of the call's version again,
// whatever its last summary said: long enough for the worker's next
// summary (debounced) to arrive, so that back-to-back calls stay on the
// instance that served the last one.
const idleHint = time.Second

// Directory is this process's view of the worker directory
// (bus.BucketWorkers), kept current by a KV watch: what every live worker
// holds. The dispatcher places calls with it, and it serves the /v1/workers
// routes, the dropping of instances and evictions (gateway.Workers).
type Directory struct {
	bus *bus.Bus
	reg *registry.Registry
	log *slog.Logger

	mu       sync.Mutex
	workers  map[string]dirEntry             // by directory key
	byID     map[string]dirEntry             // by worker id
	holders  map[string][]candidate          // by poolKey: the workers holding that version
	inflight map[inflightKey]int             // calls placed by this process, not yet answered
	returned map[string]map[string]time.Time // by poolKey, worker id: when a placed call last came back
	expired  map[string]bool                 // by key: entries that went away stale (their worker died)
}

type dirEntry struct {
	sum  api.WorkerSummary
	seen time.Time
}

type inflightKey struct{ worker, pool string }

func poolKey(name string, version int) string { return name + "@" + strconv.Itoa(version) }

// NewDirectory reads the worker directory and keeps watching it until ctx
// ends.
func NewDirectory(ctx context.Context, b *bus.Bus, reg *registry.Registry, log *slog.Logger) (*Directory, error) {
	d := &Directory{bus: b, reg: reg, log: log, workers: map[string]dirEntry{}, byID: map[string]dirEntry{},
		holders: map[string][]candidate{}, inflight: map[inflightKey]int{}, returned: map[string]map[string]time.Time{},
		expired: map[string]bool{}}
	w, err := b.Workers.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch the worker directory: %w", err)
	}
	if err := bus.Follow(ctx, w, d.apply); err != nil {
		return nil, err
	}
	return d, nil
}

// apply records one directory change and rebuilds the placement index.
// An initial entry (read at start) may be old already.
func (d *Directory) apply(e jetstream.KeyValueEntry, initial bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		// A worker that shuts down deletes its entry while it is fresh;
		// one that died leaves it to expire.
		if old, ok := d.workers[e.Key()]; ok {
			if stale(old.seen) {
				d.expired[e.Key()] = true
			}
			// Its instances went with it: a worker of the same id that
			// starts again holds none of them.
			for _, hints := range d.returned {
				delete(hints, old.sum.ID)
			}
		}
		delete(d.workers, e.Key())
	} else {
		delete(d.expired, e.Key())
		var s api.WorkerSummary
		if err := json.Unmarshal(e.Value(), &s); err != nil || s.ID == "" {
			d.log.Warn("corrupt worker directory entry", "key", e.Key(), "err", err)
			return
		}
		// When it arrived here; an initial entry when the server stored
		// it, if that is earlier. (Only there: the server's clock may be
		// behind this one's.)
		seen := time.Now()
		if c := e.Created(); initial && c.Before(seen) {
			seen = c
		}
		d.workers[e.Key()] = dirEntry{sum: s, seen: seen}
	}
	clear(d.holders)
	clear(d.byID)
	for _, w := range d.workers {
		d.byID[w.sum.ID] = w
		if w.sum.Draining {
			continue // it takes no new calls
		}
		for _, h := range w.sum.Holdings {
			if h.Idle > 0 || h.Template {
				k := poolKey(h.Function, h.Version)
				d.holders[k] = append(d.holders[k], candidate{Worker: w.sum.ID, Idle: h.Idle, Template: h.Template,
					Running: w.sum.Running})
			}
		}
	}
	for pool, hints := range d.returned {
		for worker, t := range hints {
			if time.Since(t) >= idleHint {
				delete(hints, worker)
			}
		}
		if len(hints) == 0 {
			delete(d.returned, pool)
		}
	}
}

// live reports whether an entry that arrived at seen is current. Without
// the server's expiry markers (NATS before 2.11) an entry of a dead worker
// stays in the watch; it is ignored after bus.WorkerTTL.
func live(seen time.Time) bool { return time.Since(seen) < bus.WorkerTTL }

// stale reports whether an entry that arrived at seen missed three
// refreshes in a row: its worker is dead or cut off.
func stale(seen time.Time) bool { return time.Since(seen) > 3*bus.WorkerRefresh }

// Dead reports whether worker id died without shutting down: its entry
// went stale, or expired. A worker that left cleanly, or that this
// directory never saw, is not dead.
func (d *Directory) Dead(id string) bool {
	key := bus.WorkerKey(id)
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.workers[key]; ok {
		return stale(e.seen)
	}
	return d.expired[key]
}

// place picks the worker for a call of name@version (see choose), or ""
// for any worker, and counts the call against that worker until done is
// called with the worker whose instance answered it healthy (a result; a
// handler error other than a crash or timeout would do too, but is not
// worth telling apart): the placed one, another where the call moved or
// ran again, or "" when it failed.
func (d *Directory) place(name string, version int) (worker string, done func(answeredBy string)) {
	pool := poolKey(name, version)
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	var buf [8]candidate
	cands := buf[:0]
	hints := d.returned[pool]
	for _, c := range d.holders[pool] {
		if w, ok := d.byID[c.Worker]; ok && live(w.seen) {
			if t, ok := hints[c.Worker]; ok && now.Sub(t) < idleHint {
				c.Idle = max(c.Idle, 1)
			}
			cands = append(cands, c)
		}
	}
	// A worker whose last summary, taken while it ran our call, shows
	// nothing of the version.
	for worker, t := range hints {
		w, ok := d.byID[worker]
		if now.Sub(t) < idleHint && ok && live(w.seen) && !w.sum.Draining &&
			!slices.ContainsFunc(cands, func(c candidate) bool { return c.Worker == worker }) {
			cands = append(cands, candidate{Worker: worker, Idle: 1, Running: w.sum.Running})
		}
	}
	for i := range cands {
		cands[i].Inflight = d.inflight[inflightKey{cands[i].Worker, pool}]
	}
	worker = choose(cands)
	if worker == "" {
		return "", func(by string) { d.answered(name, version, by) }
	}
	k := inflightKey{worker, pool}
	d.inflight[k]++
	return worker, func(by string) {
		d.mu.Lock()
		if d.inflight[k]--; d.inflight[k] <= 0 {
			delete(d.inflight, k)
		}
		d.mu.Unlock()
		d.answered(name, version, by)
	}
}

// answered notes that worker has just answered a call of name@version: it
// holds an idle instance of it again (see idleHint). A call that moved
// finished where it was resumed, so the hint follows it there.
func (d *Directory) answered(name string, version int, worker string) {
	if worker == "" {
		return
	}
	pool := poolKey(name, version)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.returned[pool] == nil {
		d.returned[pool] = map[string]time.Time{}
	}
	d.returned[pool][worker] = time.Now()
}

// List returns the live workers, by id.
func (d *Directory) List(context.Context) ([]api.WorkerSummary, error) {
	d.mu.Lock()
	out := make([]api.WorkerSummary, 0, len(d.workers))
	for _, w := range d.workers {
		if live(w.seen) {
			out = append(out, w.sum)
		}
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b api.WorkerSummary) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Info asks worker id for its summary and the memory of its processes.
func (d *Directory) Info(ctx context.Context, id string) (api.WorkerInfo, error) {
	var info api.WorkerInfo
	if id == "" || len(id) > 256 {
		return info, errdefs.Invalid(fmt.Sprintf("invalid worker id %q: use an id `torpor workers` lists", id))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reply, err := d.bus.NC.RequestMsgWithContext(ctx, nats.NewMsg(bus.WorkerInfoSubject(id)))
	if errors.Is(err, nats.ErrNoResponders) {
		return info, errdefs.NotFound(fmt.Sprintf("no worker %q is running: `torpor workers` lists the live ones", id))
	}
	if err != nil {
		return info, requestError("info of worker "+id, err)
	}
	res, err := callmsg.ParseReply(reply)
	if err != nil {
		return info, fmt.Errorf("info of worker %s: %w", id, err)
	}
	if err := json.Unmarshal(res.Payload, &info); err != nil {
		return info, fmt.Errorf("info of worker %s: bad reply: %w", id, err)
	}
	if info.ID != id {
		// Another id that maps to the same subject token.
		return api.WorkerInfo{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running (worker %q answered): `torpor workers` lists the live ones", id, info.ID))
	}
	return info, nil
}

// Evict asks worker id to evict itself: it stops taking calls, moves its
// running calls to other workers within the grace period and exits. The
// worker answers at once, before it moves anything, so the report says how
// the eviction starts (calls running, grace).
func (d *Directory) Evict(ctx context.Context, id string, req api.EvictRequest) (api.EvictReport, error) {
	var rep api.EvictReport
	if id == "" || len(id) > 256 {
		return rep, errdefs.Invalid(fmt.Sprintf("invalid worker id %q: use an id `torpor workers` lists", id))
	}
	if req.GraceMS < 0 || req.GraceMS > MaxEvictGrace.Milliseconds() {
		return rep, errdefs.Invalid(fmt.Sprintf("invalid grace_ms %d: use 0 (the worker's --eviction-grace) up to %d (%s)",
			req.GraceMS, MaxEvictGrace.Milliseconds(), MaxEvictGrace))
	}
	if n := utf8.RuneCountInString(req.Reason); n > MaxEvictReasonLen {
		return rep, errdefs.Invalid(fmt.Sprintf("reason is %d characters long: say it in at most %d", n, MaxEvictReasonLen))
	}
	// Unlike an info request, an eviction cannot be taken back once the
	// wrong worker has it: every worker whose id maps to the same subject
	// token evicts itself. Refuse when the directory shows such a worker.
	if err := d.checkToken(id); err != nil {
		return rep, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return rep, fmt.Errorf("evict worker %s: %w", id, err)
	}
	msg := nats.NewMsg(bus.EvictSubject(id))
	msg.Header.Set(callmsg.HWorker, id)
	msg.Data = body
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reply, err := d.bus.NC.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return rep, errdefs.NotFound(fmt.Sprintf("no worker %q is running: `torpor workers` lists the live ones", id))
	}
	if err != nil {
		return rep, requestError("evict worker "+id, err)
	}
	res, err := callmsg.ParseReply(reply)
	if err != nil {
		return rep, fmt.Errorf("evict worker %s: %w", id, err)
	}
	if err := json.Unmarshal(res.Payload, &rep); err != nil {
		return rep, fmt.Errorf("evict worker %s: bad reply: %w", id, err)
	}
	if rep.Worker != id {
		// Another id that maps to the same subject token, which the
		// directory did not show (yet).
		d.log.Warn("an evict request reached another worker", "worker", id, "answered", rep.Worker)
		return api.EvictReport{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running (worker %q answered and is evicting itself): `torpor workers` lists the live ones", id, rep.Worker))
	}
	return rep, nil
}

// checkToken fails when the directory entry under id's key (its subject
// token) is another live worker's. (Two live workers with one token share
// one entry too; that the directory cannot tell.)
func (d *Directory) checkToken(id string) error {
	d.mu.Lock()
	w, ok := d.workers[bus.WorkerKey(id)]
	d.mu.Unlock()
	if ok && live(w.seen) && w.sum.ID != id {
		return errdefs.NotFound(fmt.Sprintf("no worker %q is running (worker %q is, under the same subject): `torpor workers` lists the live ones", id, w.sum.ID))
	}
	return nil
}

// Drop asks every worker to stop the idle instances of name (version 0:
// of every version) and, unless keepTemplates, its function templates, and
// sums their answers. It waits until every worker in the directory has
// answered, or DropWait.
func (d *Directory) Drop(ctx context.Context, name string, version int, keepTemplates bool) (api.DropResult, error) {
	var res api.DropResult
	if err := function.ValidateName(name); err != nil {
		return res, err
	}
	if version < 0 {
		return res, errdefs.Invalid(fmt.Sprintf("invalid version %d: use a version number, or 0 for every version", version))
	}
	if _, err := d.reg.Resolve(name, version); err != nil {
		return res, err
	}
	workers, _ := d.List(ctx)
	if len(workers) == 0 {
		return res, nil
	}
	inbox := d.bus.NC.NewInbox()
	sub, err := d.bus.NC.SubscribeSync(inbox)
	if err != nil {
		return res, fmt.Errorf("drop instances of %s: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := callmsg.DropRequest(bus.SubjDrop, callmsg.Drop{Function: name, Version: version, KeepTemplates: keepTemplates})
	msg.Reply = inbox
	if err := d.bus.NC.PublishMsg(msg); err != nil {
		return res, fmt.Errorf("drop instances of %s: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	wctx, cancel := context.WithTimeout(ctx, DropWait)
	defer cancel()
	for answered := 0; answered < len(workers); answered++ {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			// DropWait is over: the sum of the workers that answered.
			d.log.Warn("not every worker answered a drop request", "fn", name, "answered", answered, "workers", len(workers))
			break
		}
		r, err := callmsg.ParseReply(m)
		var one api.DropResult
		if err == nil {
			err = json.Unmarshal(r.Payload, &one)
		}
		if err != nil {
			d.log.Warn("drop request failed on a worker", "fn", name, "err", err)
			continue
		}
		res.Instances += one.Instances
		res.Templates += one.Templates
		res.Workers += one.Workers
	}
	return res, nil
}
