// Package registry stores functions: their immutable versions (in a NATS KV
// bucket), their code packages (in a NATS object store, by sha256) and the
// sandbox uid each function owns. It keeps an in-memory copy of the bucket,
// fed by a KV watch, so resolving a function on the call path costs no round
// trip. It does not run code or route calls.
package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// UIDBase is the first sandbox uid; function n gets UIDBase+n. The range is
// far above login users and the usual subordinate-uid ranges.
const UIDBase = 900_000_000

// Registry is the function store. Safe for concurrent use.
type Registry struct {
	kv   jetstream.KeyValue
	code jetstream.ObjectStore
	log  *slog.Logger

	mu       sync.RWMutex
	latest   map[string]function.Version
	versions map[string]function.Version // "name/N"
	changed  chan struct{}               // closed and replaced on every update (for waiters)
}

// New starts watching the bucket and returns once the initial state is loaded.
func New(ctx context.Context, kv jetstream.KeyValue, code jetstream.ObjectStore, log *slog.Logger) (*Registry, error) {
	r := &Registry{kv: kv, code: code, log: log, latest: map[string]function.Version{},
		versions: map[string]function.Version{}, changed: make(chan struct{})}
	w, err := kv.WatchFiltered(ctx, []string{"fn.*", "v.*.*"}, jetstream.IncludeHistory())
	if err != nil {
		return nil, fmt.Errorf("watch function registry: %w", err)
	}
	if err := bus.Follow(ctx, w, func(e jetstream.KeyValueEntry, _ bool) { r.apply(e) }); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Registry) apply(e jetstream.KeyValueEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { close(r.changed); r.changed = make(chan struct{}) }()
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		if name, ok := strings.CutPrefix(key, "fn."); ok {
			delete(r.latest, name)
		} else if rest, ok := strings.CutPrefix(key, "v."); ok {
			name, n, _ := strings.Cut(rest, ".")
			delete(r.versions, name+"/"+n)
		}
		return
	}
	var v function.Version
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		r.log.Error("corrupt registry entry", "key", key, "err", err)
		return
	}
	if strings.HasPrefix(key, "fn.") {
		// Never step back: a slow deploy's write may land after a newer one's.
		if cur, ok := r.latest[v.Name]; !ok || v.Version >= cur.Version {
			r.latest[v.Name] = v
		}
	} else {
		r.versions[v.Name+"/"+strconv.Itoa(v.Version)] = v
	}
}

// Resolve returns version v of name (the latest when v is 0) from the cache.
func (r *Registry) Resolve(name string, v int) (function.Version, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var (
		ver function.Version
		ok  bool
	)
	if v == 0 {
		ver, ok = r.latest[name]
	} else {
		ver, ok = r.versions[name+"/"+strconv.Itoa(v)]
	}
	if ok {
		return ver, nil
	}
	if v != 0 {
		if _, exists := r.latest[name]; exists {
			return ver, errdefs.NotFound(fmt.Sprintf("function %s has no version %d: run `torpor ls` to see its latest version", name, v))
		}
	}
	return ver, errdefs.NotFound(fmt.Sprintf("function %s not found: deploy it first with `torpor deploy %s ...`", name, name))
}

// ResolveWait is Resolve, waiting up to ctx for a version that another
// process committed but this cache has not seen yet.
func (r *Registry) ResolveWait(ctx context.Context, name string, v int) (function.Version, error) {
	for {
		r.mu.RLock()
		ch := r.changed
		r.mu.RUnlock()
		ver, err := r.Resolve(name, v)
		if err == nil {
			return ver, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ver, err
		}
	}
}

// WaitVersion waits until this cache shows version v (or a later one) of
// name as the latest, or ctx ends.
func (r *Registry) WaitVersion(ctx context.Context, name string, v int) error {
	for {
		r.mu.RLock()
		ch := r.changed
		cur, ok := r.latest[name]
		r.mu.RUnlock()
		if ok && cur.Version >= v {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("version %d of %s not visible yet: %w", v, name, ctx.Err())
		}
	}
}

// Versions lists the cached versions of name, oldest first.
func (r *Registry) Versions(name string) []function.Version {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []function.Version
	for _, v := range r.versions {
		if v.Name == name {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// WaitGone waits until this cache no longer holds any version of name.
func (r *Registry) WaitGone(ctx context.Context, name string) error {
	for {
		r.mu.RLock()
		ch := r.changed
		_, latest := r.latest[name]
		r.mu.RUnlock()
		if !latest && len(r.Versions(name)) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CodeInUse reports whether any cached version uses the code package.
func (r *Registry) CodeInUse(digest string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, v := range r.versions {
		if v.CodeDigest == digest {
			return true
		}
	}
	for _, v := range r.latest {
		if v.CodeDigest == digest {
			return true
		}
	}
	return false
}

// DeleteCode removes a code package.
func (r *Registry) DeleteCode(ctx context.Context, digest string) error {
	if err := r.code.Delete(ctx, digest); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete code package %s: %w", digest, err)
	}
	return nil
}

// Functions lists the latest version of every function, by name.
func (r *Registry) Functions() []function.Version {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]function.Version, 0, len(r.latest))
	for _, v := range r.latest {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PutCode stores a code package and returns its hex sha256, and whether
// this call stored it (false: it was there already).
func (r *Registry) PutCode(ctx context.Context, zip []byte) (string, bool, error) {
	sum := sha256.Sum256(zip)
	digest := hex.EncodeToString(sum[:])
	if _, err := r.code.GetInfo(ctx, digest); err == nil {
		return digest, false, nil
	}
	if _, err := r.code.Put(ctx, jetstream.ObjectMeta{Name: digest}, bytes.NewReader(zip)); err != nil {
		return "", false, fmt.Errorf("store code package: %w", err)
	}
	return digest, true, nil
}

// Code fetches a code package and checks its digest.
func (r *Registry) Code(ctx context.Context, digest string) ([]byte, error) {
	b, err := r.code.GetBytes(ctx, digest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("code package %s: %w", digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch code package %s: %w", digest, err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("code package %s is corrupt (digest mismatch): redeploy the function", digest)
	}
	return b, nil
}

// Prepare returns the next version of spec.Name (not yet stored), with the
// function's uid allocated, and the revision Commit must see unchanged.
func (r *Registry) Prepare(ctx context.Context, spec function.Spec, digest string, size int64) (function.Version, uint64, error) {
	uid, err := r.uid(ctx, spec.Name)
	if err != nil {
		return function.Version{}, 0, err
	}
	next, rev := 1, uint64(0)
	e, err := r.kv.Get(ctx, "seq."+spec.Name)
	switch {
	case err == nil:
		n, _ := strconv.Atoi(string(e.Value()))
		next, rev = n+1, e.Revision()
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return function.Version{}, 0, fmt.Errorf("read version counter of %s: %w", spec.Name, err)
	}
	return function.Version{Spec: spec, Version: next, CodeDigest: digest, CodeSize: size, UID: uid,
		CreatedAt: time.Now().UTC()}, rev, nil
}

// Commit stores v as the latest version. It fails with ErrConflict when
// another deploy of the same function committed since Prepare.
func (r *Registry) Commit(ctx context.Context, v function.Version, rev uint64) error {
	seq := []byte(strconv.Itoa(v.Version))
	var err error
	if rev == 0 {
		_, err = r.kv.Create(ctx, "seq."+v.Name, seq)
	} else {
		_, err = r.kv.Update(ctx, "seq."+v.Name, seq, rev)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongSeq(err) {
			return fmt.Errorf("function %s was deployed concurrently: retry the deploy: %w", v.Name, errdefs.ErrConflict)
		}
		return fmt.Errorf("bump version of %s: %w", v.Name, err)
	}
	b, _ := json.Marshal(v)
	if _, err := r.kv.Put(ctx, fmt.Sprintf("v.%s.%d", v.Name, v.Version), b); err != nil {
		return fmt.Errorf("store %s version %d: %w", v.Name, v.Version, err)
	}
	return r.setLatest(ctx, v, b)
}

// setLatest points "fn.<name>" at v unless a newer version is already
// there: two deploys that finish out of order leave the newer one latest.
func (r *Registry) setLatest(ctx context.Context, v function.Version, b []byte) error {
	for attempt := 0; attempt < 20; attempt++ {
		e, err := r.kv.Get(ctx, "fn."+v.Name)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			_, err = r.kv.Create(ctx, "fn."+v.Name, b)
		case err != nil:
			return fmt.Errorf("read latest version of %s: %w", v.Name, err)
		default:
			var cur function.Version
			if json.Unmarshal(e.Value(), &cur) == nil && cur.Version > v.Version {
				return nil
			}
			_, err = r.kv.Update(ctx, "fn."+v.Name, b, e.Revision())
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSeq(err) {
			return fmt.Errorf("store %s version %d: %w", v.Name, v.Version, err)
		}
	}
	return fmt.Errorf("store %s version %d: too many concurrent deploys: %w", v.Name, v.Version, errdefs.ErrConflict)
}

func isWrongSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Delete removes a function and its versions. The uid stays reserved for the
// name and the version counter keeps counting, so a redeployed function never
// reuses an old version number.
func (r *Registry) Delete(ctx context.Context, name string) error {
	if _, err := r.Resolve(name, 0); err != nil {
		if _, gerr := r.kv.Get(ctx, "fn."+name); gerr != nil {
			return err
		}
	}
	if err := r.kv.Purge(ctx, "fn."+name); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	keys, err := r.kv.ListKeysFiltered(ctx, "v."+name+".*")
	if err != nil {
		return fmt.Errorf("list versions of %s: %w", name, err)
	}
	for k := range keys.Keys() {
		if err := r.kv.Purge(ctx, k); err != nil {
			return fmt.Errorf("delete %s: %w", k, err)
		}
	}
	return nil
}

// uid returns the sandbox uid of name, allocating one on first deploy.
func (r *Registry) uid(ctx context.Context, name string) (int, error) {
	if e, err := r.kv.Get(ctx, "uid."+name); err == nil {
		return strconv.Atoi(string(e.Value()))
	}
	for attempt := 0; attempt < 50; attempt++ {
		n, rev := 1, uint64(0)
		if e, err := r.kv.Get(ctx, "uidseq"); err == nil {
			n, _ = strconv.Atoi(string(e.Value()))
			n, rev = n+1, e.Revision()
		}
		var err error
		if rev == 0 {
			_, err = r.kv.Create(ctx, "uidseq", []byte(strconv.Itoa(n)))
		} else {
			_, err = r.kv.Update(ctx, "uidseq", []byte(strconv.Itoa(n)), rev)
		}
		if err != nil {
			continue // another deploy took n; try the next
		}
		uid := UIDBase + n
		if _, err := r.kv.Create(ctx, "uid."+name, []byte(strconv.Itoa(uid))); err != nil {
			// A concurrent first deploy of the same name won: use its uid.
			if e, gerr := r.kv.Get(ctx, "uid."+name); gerr == nil {
				return strconv.Atoi(string(e.Value()))
			}
			return 0, fmt.Errorf("allocate uid for %s: %w", name, err)
		}
		return uid, nil
	}
	return 0, fmt.Errorf("allocate uid for %s: too much contention: %w", name, errdefs.ErrUnavailable)
}
