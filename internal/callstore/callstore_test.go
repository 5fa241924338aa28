package callstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func newStore(t *testing.T) (*Store, *bus.Bus) {
	b := testenv.Bus(t)
	return New(b.Calls), b
}

// nextMilliCallID returns a call id from a later millisecond than any id made
// before it, so that id order is creation order.
func nextMilliCallID() string {
	start := time.Now().UnixMilli()
	for time.Now().UnixMilli() == start {
	}
	return function.NewCallID()
}

func TestPutGet(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, _ := newStore(t)
	created := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	want := function.Call{ID: function.NewCallID(), Function: "hello", Version: 3, Mode: "async",
		Status: function.StatusSucceeded, CreatedAt: created, FinishedAt: created.Add(time.Second), DurationMS: 12.5,
		Attempts: []function.Attempt{{Worker: "w1", Start: function.StartCold, StartedAt: created,
			FinishedAt: created.Add(time.Second), Outcome: function.StatusSucceeded}},
		Result: json.RawMessage(`{"ok":true}`)}
	if err := s.Put(ctx, want); err != nil {
		t.Fatal(err)
	}
	other := function.Call{ID: function.NewCallID(), Function: "other", Status: function.StatusFailed,
		Error: &function.Error{ErrorType: "ValueError", ErrorMessage: "x"}}
	if err := s.Put(ctx, other); err != nil {
		t.Fatal(err)
	}

	got, err := s.Get(ctx, want.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	wb, _ := json.Marshal(want)
	gb, _ := json.Marshal(got)
	if string(wb) != string(gb) {
		t.Errorf("Get =\n%s\nwant\n%s", gb, wb)
	}
	got, err = s.Get(ctx, other.ID)
	if err != nil || got.Function != "other" || got.Error == nil || got.Error.ErrorType != "ValueError" {
		t.Errorf("Get(other) = %+v, %v", got, err)
	}

	// Put overwrites.
	want.Status = function.StatusFailed
	if err := s.Put(ctx, want); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, want.ID); got.Status != function.StatusFailed {
		t.Errorf("after overwrite Status = %q", got.Status)
	}
}

func TestGetUnknownOrMalformed(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, _ := newStore(t)
	if err := s.Put(ctx, function.Call{ID: function.NewCallID(), Function: "f"}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		id    string
		class error
		text  string
	}{
		{"unknown", function.NewCallID(), errdefs.ErrNotFound, "not found"},
		{"empty", "", errdefs.ErrInvalid, "invalid call id"},
		{"wildcard", "*", errdefs.ErrInvalid, "invalid call id"},
		{"full wildcard", ">", errdefs.ErrInvalid, "invalid call id"},
		{"subject injection", "x.>", errdefs.ErrInvalid, "invalid call id"},
		{"junk", "hello world", errdefs.ErrInvalid, "invalid call id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := s.Get(ctx, tt.id)
			if !errors.Is(err, tt.class) {
				t.Fatalf("Get(%q) = %v, want %v", tt.id, err, tt.class)
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("error %q does not contain %q", err, tt.text)
			}
			if time.Since(start) > 5*time.Second {
				t.Errorf("Get took %s", time.Since(start))
			}
		})
	}
}

func TestGetHonoursContext(t *testing.T) {
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Get(ctx, function.NewCallID()); err == nil {
		t.Error("Get with a cancelled context succeeded")
	}
}

func TestUpdate(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, _ := newStore(t)
	id := function.NewCallID()
	if err := s.Put(ctx, function.Call{ID: id, Function: "f", Status: function.StatusQueued}); err != nil {
		t.Fatal(err)
	}

	got, err := s.Update(ctx, "f", id, func(c *function.Call) error {
		c.Status = function.StatusRunning
		return nil
	})
	if err != nil || got.Status != function.StatusRunning {
		t.Fatalf("Update = %+v, %v", got, err)
	}
	if stored, _ := s.Get(ctx, id); stored.Status != function.StatusRunning {
		t.Errorf("stored Status = %q after Update", stored.Status)
	}

	t.Run("callback error aborts", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := s.Update(ctx, "f", id, func(c *function.Call) error {
			c.Status = function.StatusFailed
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Update = %v, want the callback's error", err)
		}
		if stored, _ := s.Get(ctx, id); stored.Status != function.StatusRunning {
			t.Errorf("aborted Update wrote Status %q", stored.Status)
		}
	})
	t.Run("missing record", func(t *testing.T) {
		missing := function.NewCallID()
		_, err := s.Update(ctx, "f", missing, func(*function.Call) error { return nil })
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
			t.Errorf("Update(missing) = %v, want ErrNotFound naming the id", err)
		}
	})
	t.Run("wrong function", func(t *testing.T) {
		_, err := s.Update(ctx, "g", id, func(*function.Call) error { return nil })
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Update under another function = %v, want ErrNotFound", err)
		}
	})
}

func TestUpdateConcurrent(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, _ := newStore(t)
	id := function.NewCallID()
	if err := s.Put(ctx, function.Call{ID: id, Function: "f"}); err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Update(ctx, "f", id, func(c *function.Call) error {
				c.Attempts = append(c.Attempts, function.Attempt{Worker: fmt.Sprintf("w%d", i)})
				return nil
			})
			if err != nil {
				t.Errorf("Update %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	c, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, a := range c.Attempts {
		seen[a.Worker]++
	}
	for i := 0; i < n; i++ {
		if w := fmt.Sprintf("w%d", i); seen[w] != 1 {
			t.Errorf("attempt of %s present %d times, want 1", w, seen[w])
		}
	}
	if len(c.Attempts) != n {
		t.Errorf("%d attempts, want %d", len(c.Attempts), n)
	}
}

// Update gives up after a bounded number of lost races instead of spinning.
func TestUpdateGivesUp(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, b := newStore(t)
	id := function.NewCallID()
	if err := s.Put(ctx, function.Call{ID: id, Function: "f"}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err := s.Update(ctx, "f", id, func(c *function.Call) error {
		calls++
		// Another writer always gets in between.
		if _, err := b.Calls.Put(ctx, "f."+id, []byte(fmt.Sprintf(`{"id":%q,"function":"f"}`, id))); err != nil {
			t.Fatal(err)
		}
		return nil
	})
	if err == nil {
		t.Fatal("Update succeeded although every write raced")
	}
	if !strings.Contains(err.Error(), id) {
		t.Errorf("error %q does not name the call", err)
	}
	if calls < 2 || calls > 50 {
		t.Errorf("callback ran %d times, want a small bounded number of retries", calls)
	}
}

func TestList(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, _ := newStore(t)
	var ids []string // oldest first
	for i := 0; i < 5; i++ {
		id := nextMilliCallID()
		ids = append(ids, id)
		if err := s.Put(ctx, function.Call{ID: id, Function: "f", Version: i}); err != nil {
			t.Fatal(err)
		}
	}
	// Other functions' calls, including one whose name extends "f", stay out.
	for _, fn := range []string{"g", "f-2", "ff"} {
		if err := s.Put(ctx, function.Call{ID: nextMilliCallID(), Function: fn}); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		limit int
		want  int
	}{{0, 5}, {-1, 5}, {2, 2}, {5, 5}, {10, 5}, {1, 1}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("limit=%d", tt.limit), func(t *testing.T) {
			got, err := s.List(ctx, "f", tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want {
				t.Fatalf("List returned %d calls, want %d", len(got), tt.want)
			}
			for i, c := range got {
				if want := ids[len(ids)-1-i]; c.ID != want || c.Function != "f" {
					t.Errorf("List[%d] = %s (%s), want %s (newest first)", i, c.ID, c.Function, want)
				}
			}
		})
	}

	t.Run("no calls", func(t *testing.T) {
		got, err := s.List(ctx, "nothing", 10)
		if err != nil || len(got) != 0 {
			t.Errorf("List(nothing) = %v, %v", got, err)
		}
	})
	t.Run("overwritten record listed once", func(t *testing.T) {
		if err := s.Put(ctx, function.Call{ID: ids[0], Function: "f", Status: function.StatusSucceeded}); err != nil {
			t.Fatal(err)
		}
		got, err := s.List(ctx, "f", 0)
		if err != nil || len(got) != 5 {
			t.Fatalf("List = %d calls, %v", len(got), err)
		}
		if got[4].Status != function.StatusSucceeded {
			t.Errorf("oldest call Status = %q, want the overwritten value", got[4].Status)
		}
	})
}

func TestListSkipsCorruptRecords(t *testing.T) {
	ctx := testenv.Ctx(t)
	s, b := newStore(t)
	id := function.NewCallID()
	if err := s.Put(ctx, function.Call{ID: id, Function: "f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Calls.Put(ctx, "f."+function.NewCallID(), []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	got, err := s.List(ctx, "f", 0)
	if err != nil || len(got) != 1 || got[0].ID != id {
		t.Errorf("List = %+v, %v; want only the good record", got, err)
	}
}
