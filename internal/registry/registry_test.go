package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// newRegistry starts a Registry on b that lives until the test ends.
func newRegistry(t *testing.T, b *bus.Bus) *Registry {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r, err := New(ctx, b.Functions, b.Code, testenv.Logger(t))
	if err != nil {
		t.Fatalf("registry.New: %v", err)
	}
	return r
}

func spec(name string) function.Spec {
	s := function.Spec{Name: name, Handler: "app.handler"}
	if err := s.Normalize(); err != nil {
		panic(err)
	}
	return s
}

// deploy prepares and commits one version of name and waits until r sees it.
func deploy(t *testing.T, r *Registry, name string) function.Version {
	t.Helper()
	ctx := testenv.Ctx(t)
	v, rev, err := r.Prepare(ctx, spec(name), "digest-"+name, 10)
	if err != nil {
		t.Fatalf("Prepare %s: %v", name, err)
	}
	if err := r.Commit(ctx, v, rev); err != nil {
		t.Fatalf("Commit %s v%d: %v", name, v.Version, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := r.ResolveWait(wctx, name, v.Version); err != nil {
		t.Fatalf("version %d of %s never became visible: %v", v.Version, name, err)
	}
	return v
}

func TestPrepareCommitSequence(t *testing.T) {
	ctx := testenv.Ctx(t)
	r := newRegistry(t, testenv.Bus(t))

	var uid int
	for want := 1; want <= 3; want++ {
		v, rev, err := r.Prepare(ctx, spec("hello"), "abc", 123)
		if err != nil {
			t.Fatal(err)
		}
		if v.Version != want {
			t.Fatalf("Prepare version = %d, want %d", v.Version, want)
		}
		if (rev == 0) != (want == 1) {
			t.Errorf("version %d: rev = %d (0 only for the first deploy)", want, rev)
		}
		if v.CodeDigest != "abc" || v.CodeSize != 123 || v.Name != "hello" || v.Handler != "app.handler" {
			t.Errorf("Prepare = %+v", v)
		}
		if v.CreatedAt.IsZero() || v.CreatedAt.Location() != time.UTC {
			t.Errorf("CreatedAt = %v, want a UTC time", v.CreatedAt)
		}
		if want == 1 {
			uid = v.UID
			if uid <= UIDBase {
				t.Errorf("uid = %d, want > %d", uid, UIDBase)
			}
		} else if v.UID != uid {
			t.Errorf("version %d uid = %d, want the stable %d", want, v.UID, uid)
		}
		// Preparing does not reserve the version: preparing again gives the same one.
		if again, _, err := r.Prepare(ctx, spec("hello"), "abc", 123); err != nil || again.Version != want {
			t.Errorf("second Prepare = v%d, %v; want v%d", again.Version, err, want)
		}
		if err := r.Commit(ctx, v, rev); err != nil {
			t.Fatalf("Commit v%d: %v", want, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := r.ResolveWait(wctx, "hello", want)
		cancel()
		if err != nil || got.Version != want || got.UID != uid {
			t.Fatalf("ResolveWait v%d = %+v, %v", want, got, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "latest to be v3", func() bool {
		v, err := r.Resolve("hello", 0)
		return err == nil && v.Version == 3
	})

	other := deploy(t, r, "other")
	third := deploy(t, r, "third")
	if other.UID == uid || third.UID == uid || other.UID == third.UID {
		t.Errorf("uids not distinct: hello=%d other=%d third=%d", uid, other.UID, third.UID)
	}
	if other.Version != 1 {
		t.Errorf("first version of another function = %d, want 1", other.Version)
	}
}

func TestCommitConflict(t *testing.T) {
	ctx := testenv.Ctx(t)
	r := newRegistry(t, testenv.Bus(t))

	// Two first deploys of the same name (rev 0 on both).
	a, revA, err := r.Prepare(ctx, spec("f"), "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	b, revB, err := r.Prepare(ctx, spec("f"), "b", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx, a, revA); err != nil {
		t.Fatal(err)
	}
	err = r.Commit(ctx, b, revB)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second first-deploy Commit = %v, want ErrConflict", err)
	}
	if !strings.Contains(err.Error(), "f") || !strings.Contains(err.Error(), "retry") {
		t.Errorf("conflict error %q does not name the function or say to retry", err)
	}

	// Two later deploys (rev > 0).
	c, revC, _ := r.Prepare(ctx, spec("f"), "c", 1)
	d, revD, _ := r.Prepare(ctx, spec("f"), "d", 1)
	if err := r.Commit(ctx, c, revC); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx, d, revD); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("stale Commit = %v, want ErrConflict", err)
	}

	// The loser stored nothing: v2 is c.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := r.ResolveWait(wctx, "f", 2)
	if err != nil || got.CodeDigest != "c" {
		t.Errorf("v2 = %+v, %v; want the winner's (digest c)", got, err)
	}
	if _, err := r.Resolve("f", 3); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("v3 exists after a lost commit: %v", err)
	}
}

func TestCommitConcurrent(t *testing.T) {
	ctx := testenv.Ctx(t)
	r := newRegistry(t, testenv.Bus(t))
	const n = 8
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		versions = map[int]string{}
		uids     = map[int]bool{}
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			digest := fmt.Sprintf("d%d", i)
			v, rev, err := r.Prepare(ctx, spec("race"), digest, 1)
			if err != nil {
				t.Errorf("Prepare: %v", err)
				return
			}
			err = r.Commit(ctx, v, rev)
			mu.Lock()
			defer mu.Unlock()
			uids[v.UID] = true
			switch {
			case err == nil:
				if prev, dup := versions[v.Version]; dup {
					t.Errorf("version %d committed twice (%s and %s)", v.Version, prev, digest)
				}
				versions[v.Version] = digest
			case !errors.Is(err, errdefs.ErrConflict):
				t.Errorf("Commit: %v, want nil or ErrConflict", err)
			}
		}()
	}
	wg.Wait()
	if len(versions) == 0 {
		t.Fatal("no concurrent commit succeeded")
	}
	if len(uids) != 1 {
		t.Errorf("concurrent first deploys allocated %d uids, want 1: %v", len(uids), uids)
	}
	for v := 1; v <= len(versions); v++ {
		if _, ok := versions[v]; !ok {
			t.Errorf("committed versions %v are not 1..%d", versions, len(versions))
		}
	}
}

func TestResolve(t *testing.T) {
	r := newRegistry(t, testenv.Bus(t))
	deploy(t, r, "fn")
	deploy(t, r, "fn")
	testenv.Eventually(t, 5*time.Second, "latest to be v2", func() bool {
		v, err := r.Resolve("fn", 0)
		return err == nil && v.Version == 2
	})

	tests := []struct {
		name    string
		fn      string
		version int
		want    int      // version, when found
		errText []string // when not found
	}{
		{"latest", "fn", 0, 2, nil},
		{"first", "fn", 1, 1, nil},
		{"second", "fn", 2, 2, nil},
		{"missing version", "fn", 9, 0, []string{"function fn has no version 9", "torpor ls"}},
		{"missing function", "nope", 0, 0, []string{"function nope not found", "torpor deploy nope"}},
		{"missing function and version", "nope", 3, 0, []string{"function nope not found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := r.Resolve(tt.fn, tt.version)
			if tt.errText == nil {
				if err != nil || v.Version != tt.want || v.Name != tt.fn {
					t.Fatalf("Resolve = %+v, %v; want v%d", v, err, tt.want)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("Resolve = %v, want ErrNotFound", err)
			}
			for _, w := range tt.errText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestResolveWaitSeesOtherRegistry(t *testing.T) {
	ctx := testenv.Ctx(t)
	b := testenv.Bus(t)
	writer := newRegistry(t, b)
	reader := newRegistry(t, b)

	type result struct {
		v   function.Version
		err error
	}
	done := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := reader.ResolveWait(wctx, "shared", 0)
		done <- result{v, err}
	}()
	// The waiter is parked on a function that does not exist yet.
	if _, err := reader.Resolve("shared", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Resolve before deploy = %v", err)
	}
	w := deploy(t, writer, "shared")
	select {
	case res := <-done:
		if res.err != nil || res.v.Version != 1 || res.v.UID != w.UID {
			t.Fatalf("ResolveWait = %+v, %v", res.v, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ResolveWait did not see a commit made through another Registry")
	}

	// A specific version committed elsewhere.
	v2 := deploy(t, writer, "shared")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := reader.ResolveWait(wctx, "shared", v2.Version)
	if err != nil || got.Version != 2 {
		t.Fatalf("ResolveWait v2 = %+v, %v", got, err)
	}
}

func TestResolveWaitTimesOut(t *testing.T) {
	r := newRegistry(t, testenv.Bus(t))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.ResolveWait(ctx, "never", 0)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ResolveWait = %v, want the NotFound error once ctx expires", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ResolveWait returned %s after its deadline", d)
	}
}

func TestNewLoadsExistingState(t *testing.T) {
	b := testenv.Bus(t)
	first := newRegistry(t, b)
	deploy(t, first, "a")
	deploy(t, first, "a")
	deploy(t, first, "b")
	// A Registry started later has everything as soon as New returns.
	second := newRegistry(t, b)
	if v, err := second.Resolve("a", 0); err != nil || v.Version != 2 {
		t.Errorf("Resolve(a) = %+v, %v", v, err)
	}
	if v, err := second.Resolve("a", 1); err != nil || v.Version != 1 {
		t.Errorf("Resolve(a, 1) = %+v, %v", v, err)
	}
	if got := len(second.Functions()); got != 2 {
		t.Errorf("Functions() has %d entries, want 2", got)
	}
}

func TestDelete(t *testing.T) {
	ctx := testenv.Ctx(t)
	b := testenv.Bus(t)
	r := newRegistry(t, b)
	v1 := deploy(t, r, "gone")
	deploy(t, r, "gone")
	deploy(t, r, "kept")

	if err := r.Delete(ctx, "gone"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, "deleted function to disappear from the cache", func() bool {
		_, e0 := r.Resolve("gone", 0)
		_, e1 := r.Resolve("gone", 1)
		_, e2 := r.Resolve("gone", 2)
		return errors.Is(e0, errdefs.ErrNotFound) && errors.Is(e1, errdefs.ErrNotFound) && errors.Is(e2, errdefs.ErrNotFound)
	})
	for _, f := range r.Functions() {
		if f.Name == "gone" {
			t.Error("Functions() still lists a deleted function")
		}
	}
	if _, err := r.Resolve("kept", 0); err != nil {
		t.Errorf("Delete removed another function: %v", err)
	}
	// The versions are gone from the bucket, not just from the cache.
	fresh := newRegistry(t, b)
	if _, err := fresh.Resolve("gone", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a fresh Registry still resolves gone v1: %v", err)
	}

	// Deleting again, or deleting a function that never existed, is NotFound.
	for _, name := range []string{"gone", "never"} {
		if err := r.Delete(ctx, name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Delete(%s) = %v, want ErrNotFound", name, err)
		}
	}

	// A redeploy continues the counter and keeps the uid.
	v3 := deploy(t, r, "gone")
	if v3.Version != 3 {
		t.Errorf("redeploy after delete = v%d, want v3", v3.Version)
	}
	if v3.UID != v1.UID {
		t.Errorf("redeploy uid = %d, want %d", v3.UID, v1.UID)
	}
	if _, err := r.Resolve("gone", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("old version 1 came back after redeploy: %v", err)
	}
}

func TestCode(t *testing.T) {
	ctx := testenv.Ctx(t)
	b := testenv.Bus(t)
	r := newRegistry(t, b)

	zip := []byte("PK\x03\x04 pretend this is a zip")
	sum := sha256.Sum256(zip)
	want := hex.EncodeToString(sum[:])
	digest, _, err := r.PutCode(ctx, zip)
	if err != nil {
		t.Fatal(err)
	}
	if digest != want {
		t.Errorf("digest = %s, want sha256 %s", digest, want)
	}
	// Storing the same package again is a no-op with the same digest.
	if again, _, err := r.PutCode(ctx, zip); err != nil || again != digest {
		t.Errorf("second PutCode = %s, %v", again, err)
	}
	got, err := r.Code(ctx, digest)
	if err != nil || string(got) != string(zip) {
		t.Fatalf("Code = %q, %v", got, err)
	}

	// Large packages (several object-store chunks) round-trip too.
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	bd, _, err := r.PutCode(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Code(ctx, bd); err != nil || len(got) != len(big) {
		t.Fatalf("Code(big) = %d bytes, %v", len(got), err)
	}

	t.Run("missing", func(t *testing.T) {
		missing := strings.Repeat("0", 64)
		_, err := r.Code(ctx, missing)
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
			t.Errorf("Code(missing) = %v, want ErrNotFound naming the digest", err)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		if _, err := b.Code.PutBytes(ctx, digest, []byte("tampered")); err != nil {
			t.Fatal(err)
		}
		_, err := r.Code(ctx, digest)
		if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "redeploy") {
			t.Errorf("Code of a tampered package = %v, want a digest-mismatch error", err)
		}
	})
}

func TestFunctionsSorted(t *testing.T) {
	r := newRegistry(t, testenv.Bus(t))
	if got := r.Functions(); len(got) != 0 {
		t.Fatalf("empty registry lists %v", got)
	}
	for _, n := range []string{"zeta", "alpha", "Mid", "beta", "alpha"} {
		deploy(t, r, n)
	}
	testenv.Eventually(t, 5*time.Second, "four functions", func() bool { return len(r.Functions()) == 4 })
	var names []string
	for _, f := range r.Functions() {
		names = append(names, f.Name)
	}
	want := []string{"Mid", "alpha", "beta", "zeta"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("Functions() = %v, want %v", names, want)
	}
	testenv.Eventually(t, 5*time.Second, "alpha at v2", func() bool {
		for _, f := range r.Functions() {
			if f.Name == "alpha" {
				return f.Version == 2
			}
		}
		return false
	})
}

// A corrupt entry is skipped, not fatal: the rest of the registry works.
func TestCorruptEntryIgnored(t *testing.T) {
	ctx := testenv.Ctx(t)
	b := testenv.Bus(t)
	if _, err := b.Functions.Put(ctx, "fn.bad", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, b)
	if _, err := r.Resolve("bad", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resolve(bad) = %v", err)
	}
	deploy(t, r, "good")
}

func TestWaitVersion(t *testing.T) {
	ctx := testenv.Ctx(t)
	b := testenv.Bus(t)
	writer := newRegistry(t, b)
	reader := newRegistry(t, b)
	deploy(t, writer, "w")

	// Already visible (or visible soon): returns without error.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := reader.WaitVersion(wctx, "w", 1); err != nil {
		t.Fatalf("WaitVersion(w, 1) = %v", err)
	}

	// Waits for a version committed later through another Registry.
	done := make(chan error, 1)
	go func() { done <- reader.WaitVersion(wctx, "w", 2) }()
	deploy(t, writer, "w")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitVersion(w, 2) = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitVersion did not see v2")
	}
	if v, err := reader.Resolve("w", 0); err != nil || v.Version != 2 {
		t.Errorf("after WaitVersion the latest is %+v, %v", v, err)
	}
	// An older version counts as visible once a newer one is the latest.
	if err := reader.WaitVersion(wctx, "w", 1); err != nil {
		t.Errorf("WaitVersion(w, 1) with v2 latest = %v", err)
	}

	// A version that never comes ends with the context's error.
	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	err := reader.WaitVersion(short, "w", 3)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "version 3 of w") {
		t.Errorf("WaitVersion(w, 3) = %v, want a deadline error naming the version", err)
	}
}
