// Package callstore keeps call records in a NATS KV bucket under
// "<function>.<call id>", so one function's calls list by key prefix and a
// call id alone is found by a wildcard lookup. It does not run calls.
package callstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Store reads and writes call records.
type Store struct{ kv jetstream.KeyValue }

// New returns a Store over the call bucket.
func New(kv jetstream.KeyValue) *Store { return &Store{kv: kv} }

func key(fn, id string) string { return fn + "." + id }

// Put writes a record unconditionally.
func (s *Store) Put(ctx context.Context, c function.Call) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode call %s: %w", c.ID, err)
	}
	if _, err := s.kv.Put(ctx, key(c.Function, c.ID), b); err != nil {
		return fmt.Errorf("store call %s: %w", c.ID, err)
	}
	return nil
}

// Create writes a new record; it fails with ErrConflict if the call exists.
func (s *Store) Create(ctx context.Context, c function.Call) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode call %s: %w", c.ID, err)
	}
	if _, err := s.kv.Create(ctx, key(c.Function, c.ID), b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("call %s exists: %w", c.ID, errdefs.ErrConflict)
		}
		return fmt.Errorf("store call %s: %w", c.ID, err)
	}
	return nil
}

// Delete removes a record.
func (s *Store) Delete(ctx context.Context, fn, id string) error {
	if err := s.kv.Purge(ctx, key(fn, id)); err != nil {
		return fmt.Errorf("delete call %s: %w", id, err)
	}
	return nil
}

// Update applies fn to the current record of call id of function name and
// stores the result, retrying on concurrent writes. fn may return an error to
// abort without writing.
func (s *Store) Update(ctx context.Context, name, id string, fn func(*function.Call) error) (function.Call, error) {
	for attempt := 0; ; attempt++ {
		e, err := s.kv.Get(ctx, key(name, id))
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return function.Call{}, errdefs.NotFound(fmt.Sprintf("call %s not found", id))
			}
			return function.Call{}, fmt.Errorf("read call %s: %w", id, err)
		}
		var c function.Call
		if err := json.Unmarshal(e.Value(), &c); err != nil {
			return c, fmt.Errorf("decode call %s: %w", id, err)
		}
		if err := fn(&c); err != nil {
			return c, err
		}
		b, _ := json.Marshal(c)
		if _, err := s.kv.Update(ctx, key(name, id), b, e.Revision()); err != nil {
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
				if attempt < 20 {
					continue // another writer got there first: re-read and re-apply
				}
				return c, fmt.Errorf("update call %s: too many concurrent writers: %w", id, errdefs.ErrConflict)
			}
			return c, fmt.Errorf("update call %s: %w", id, err)
		}
		return c, nil
	}
}

// Get finds a call by id alone.
func (s *Store) Get(ctx context.Context, id string) (function.Call, error) {
	if err := function.ValidateCallID(id); err != nil {
		return function.Call{}, err
	}
	w, err := s.kv.Watch(ctx, "*."+id, jetstream.IgnoreDeletes())
	if err != nil {
		return function.Call{}, fmt.Errorf("look up call %s: %w", id, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return function.Call{}, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return function.Call{}, errdefs.NotFound(fmt.Sprintf("call %s not found (records are kept for a limited time)", id))
			}
			var c function.Call
			if err := json.Unmarshal(e.Value(), &c); err != nil {
				return c, fmt.Errorf("decode call %s: %w", id, err)
			}
			return c, nil
		}
	}
}

// List returns up to limit records of function name, newest first. It
// lists keys only, and reads just the records it returns.
func (s *Store) List(ctx context.Context, name string, limit int) ([]function.Call, error) {
	lister, err := s.kv.ListKeysFiltered(ctx, name+".*")
	if err != nil {
		return nil, fmt.Errorf("list calls of %s: %w", name, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	// Call ids are UUIDv7, so key order is arrival order.
	sort.Sort(sort.Reverse(sort.StringSlice(keys)))
	out := []function.Call{}
	for _, k := range keys {
		if limit > 0 && len(out) == limit {
			break
		}
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired or deleted since listed
		}
		if err != nil {
			return nil, fmt.Errorf("read call %s: %w", k, err)
		}
		var c function.Call
		if err := json.Unmarshal(e.Value(), &c); err == nil {
			out = append(out, c)
		}
	}
	return out, nil
}
