package snapshot_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// fakeEngine is a unit-test double of the CRIU engine (the real one is
// tested in package criu and, end to end, in internal/app): its
// "checkpoint" writes files, its "restore" reads them back.
type fakeEngine struct {
	mu       sync.Mutex
	files    map[string]string // what the next checkpoint writes
	restored []map[string]string
}

func (f *fakeEngine) Checkpoint(_ context.Context, _ snapshot.CheckpointSpec, sink snapshot.ImageSink) (snapshot.CheckpointStats, error) {
	var n int64
	for name, data := range f.files {
		w, err := sink.Open(name)
		if err != nil {
			return snapshot.CheckpointStats{}, err
		}
		m, _ := io.WriteString(w, data)
		n += int64(m)
		if err := w.Close(); err != nil {
			return snapshot.CheckpointStats{}, err
		}
	}
	return snapshot.CheckpointStats{Bytes: n}, nil
}

func (f *fakeEngine) Restore(_ context.Context, spec snapshot.RestoreSpec) (snapshot.RestoreStats, error) {
	entries, err := os.ReadDir(spec.ImagesDir)
	if err != nil {
		return snapshot.RestoreStats{}, err
	}
	got := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(spec.ImagesDir, e.Name()))
		if err != nil {
			return snapshot.RestoreStats{}, err
		}
		got[e.Name()] = string(b)
	}
	f.mu.Lock()
	f.restored = append(f.restored, got)
	f.mu.Unlock()
	return snapshot.RestoreStats{Pid: 4242}, nil
}

func (f *fakeEngine) Info(context.Context) (snapshot.EngineInfo, error) {
	return snapshot.EngineInfo{Name: "fake", Version: "4.2"}, nil
}

func newService(t *testing.T, cacheBytes int64) (*snapshot.Service, *fakeEngine, string) {
	t.Helper()
	root := t.TempDir()
	store, err := localdir.New(root)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := image.LoadOrCreateKey(filepath.Join(t.TempDir(), "key"))
	if err != nil {
		t.Fatal(err)
	}
	eng := &fakeEngine{files: map[string]string{"core-1.img": "core", "pages-1.img": strings.Repeat("p", 1<<16)}}
	svc, err := snapshot.NewService(eng, store, keys, snapshot.ServiceConfig{EngineVersion: "4.2", ScratchDir: t.TempDir(), CacheBytes: cacheBytes}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	return svc, eng, root
}

func TestServiceRestoreCachesVerifiedImages(t *testing.T) {
	ctx := testenv.Ctx(t)
	svc, eng, _ := newService(t, 0)
	res, err := svc.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: 1}, snapshot.Meta{Function: "fn", Version: 1, Runtime: "python3.11.7"})
	if err != nil {
		t.Fatal(err)
	}
	for i, wantCached := range []bool{false, true, true} {
		r, err := svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: "python3.11.7"}, snapshot.RestoreSpec{})
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if r.Cached != wantCached || r.Restore.Pid != 4242 || r.Manifest.Function != "fn" {
			t.Errorf("restore %d: cached=%v pid=%d fn=%q, want cached=%v", i, r.Cached, r.Restore.Pid, r.Manifest.Function, wantCached)
		}
		if got := eng.restored[i]; len(got) != 2 || got["core-1.img"] != "core" {
			t.Errorf("restore %d: the engine saw %d files", i, len(got))
		}
	}
	// Restored as another function: refused before the engine runs.
	n := len(eng.restored)
	if _, err := svc.Restore(ctx, res.ID, snapshot.Expect{Function: "other", Version: 1, Runtime: "python3.11.7"}, snapshot.RestoreSpec{}); !errors.Is(err, image.ErrIncompatible) || len(eng.restored) != n {
		t.Errorf("restore as another function: %v (engine ran %d times), want ErrIncompatible", err, len(eng.restored)-n)
	}
	// A cached image is still checked against the runtime asking for it.
	if _, err := svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: "python3.12.0"}, snapshot.RestoreSpec{}); !errors.Is(err, image.ErrIncompatible) {
		t.Errorf("restore for another runtime: %v, want ErrIncompatible", err)
	}
	// A deleted snapshot is not restored from the cache.
	if err := image.Delete(ctx, svc.Store(), res.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: "python3.11.7"}, snapshot.RestoreSpec{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("restore after delete: %v, want ErrNotFound", err)
	}
}

func TestServiceRefusesTamperedImages(t *testing.T) {
	ctx := testenv.Ctx(t)
	svc, eng, root := newService(t, 0)
	res, err := svc.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: 1}, snapshot.Meta{Function: "fn", Version: 1, Runtime: "py"})
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(root, filepath.FromSlash(res.Manifest.DataKey))
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(data, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // refused every time: a refused image is never cached
		_, err := svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: "py"}, snapshot.RestoreSpec{})
		if !image.IsRefused(err) {
			t.Fatalf("restore %d of a tampered image: %v, want a refusal", i, err)
		}
	}
	if len(eng.restored) != 0 {
		t.Errorf("the engine saw a tampered image %d times", len(eng.restored))
	}
}

func TestServiceCacheBudget(t *testing.T) {
	ctx := testenv.Ctx(t)
	svc, _, _ := newService(t, 100<<10) // room for one image of ~64 KiB
	var ids []string
	for v := range 3 {
		res, err := svc.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: 1}, snapshot.Meta{Function: "fn", Version: v + 1, Runtime: "py"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	tests := []struct {
		id     string
		cached bool
	}{
		{ids[0], false}, {ids[0], true}, // cached
		{ids[1], false}, {ids[0], false}, // ids[1] pushed ids[0] out
		{ids[2], false}, {ids[2], true},
	}
	for i, tt := range tests {
		r, err := svc.Restore(ctx, tt.id, snapshot.Expect{Runtime: "py"}, snapshot.RestoreSpec{})
		if err != nil || r.Cached != tt.cached {
			t.Errorf("step %d: cached=%v err=%v, want cached=%v", i, r.Cached, err, tt.cached)
		}
	}
	// An image larger than the whole budget is used once and not kept.
	small, _, _ := newService(t, 1<<10)
	res, err := small.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: 1}, snapshot.Meta{Function: "fn", Version: 1, Runtime: "py"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r, err := small.Restore(ctx, res.ID, snapshot.Expect{Runtime: "py"}, snapshot.RestoreSpec{}); err != nil || r.Cached {
			t.Errorf("oversized image, restore %d: cached=%v err=%v", i, r.Cached, err)
		}
	}
}

func TestServicePrefetch(t *testing.T) {
	ctx := testenv.Ctx(t)
	svc, eng, _ := newService(t, 0)
	res, err := svc.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: 1}, snapshot.Meta{Function: "fn", Version: 1, Runtime: "py"})
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot.Expect{Function: "fn", Version: 1, Runtime: "py"}
	if err := svc.Prefetch(ctx, res.ID, want); err != nil {
		t.Fatal(err)
	}
	if len(eng.restored) != 0 {
		t.Fatal("Prefetch ran the engine")
	}
	r, err := svc.Restore(ctx, res.ID, want, snapshot.RestoreSpec{})
	if err != nil || !r.Cached {
		t.Errorf("first restore after a prefetch: cached=%v err=%v, want cached", r.Cached, err)
	}
	if err := svc.Prefetch(ctx, "sha256:"+strings.Repeat("0", 64), want); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("prefetch of a missing snapshot: %v, want ErrNotFound", err)
	}
}
