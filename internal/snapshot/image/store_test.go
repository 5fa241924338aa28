package image

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestResolve(t *testing.T) {
	store := newMemStore()
	ids := []string{
		"abcd1111" + strings.Repeat("0", 56),
		"abcd2222" + strings.Repeat("0", 56),
		"abce" + strings.Repeat("1", 60),
	}
	for _, h := range ids {
		store.set(ManifestPrefix+h, []byte("{}"))
	}
	store.set(ManifestPrefix+"abcf-not-a-digest", []byte("{}"))
	store.set(DataPrefix+"abcd9999", []byte("data is not a manifest"))
	tests := []struct {
		ref   string
		want  string // full hex, or "" for an error
		class error
		msg   string
	}{
		{ref: "abcd1", want: ids[0]},
		{ref: "sha256:abcd2", want: ids[1]},
		{ref: "abce", want: ids[2]},
		{ref: IDPrefix + ids[2], want: ids[2]},
		{ref: ids[0], want: ids[0]},
		{ref: "abcd", class: errdefs.ErrConflict, msg: "ambiguous: 2 snapshots match"},
		{ref: "abcf", class: errdefs.ErrNotFound, msg: "no snapshot id starts with abcf"},
		{ref: "ffff", class: errdefs.ErrNotFound},
		{ref: strings.Repeat("f", 64), class: errdefs.ErrNotFound, msg: "not found"},
		{ref: "abc", class: errdefs.ErrInvalid, msg: "at least 4"},
		{ref: "", class: errdefs.ErrInvalid},
		{ref: "sha256:", class: errdefs.ErrInvalid},
		{ref: "ABCD", class: errdefs.ErrInvalid, msg: "lowercase hex"},
		{ref: "abcd/", class: errdefs.ErrInvalid},
		{ref: strings.Repeat("a", 65), class: errdefs.ErrInvalid},
		{ref: "sha512:abcd", class: errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			got, err := Resolve(context.Background(), store, tt.ref)
			if tt.want != "" {
				if err != nil || got != IDPrefix+tt.want {
					t.Fatalf("Resolve = %q, %v; want %s", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Resolve = %q, %v; want %v containing %q", got, err, tt.class, tt.msg)
			}
		})
	}
}

func TestListStatDelete(t *testing.T) {
	ctx := context.Background()
	store, key := newMemStore(), testKey(t, 1)
	var ids []string
	for i := range 2 {
		o := testOptions(Zstd)
		o.Manifest.CreatedAt = time.Date(2025, 1, 2-i, 0, 0, 0, 0, time.UTC) // the second is older
		id, _, _, err := Write(ctx, store, key, o, produceFiles(testFiles(true, 1000)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	bad := strings.Repeat("b", 64)
	store.set(ManifestPrefix+bad, []byte(`{"format":1}`)) // does not hash to its name

	list, err := List(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("List = %+v", list)
	}
	// The damaged one has no CreatedAt and sorts first, then oldest first.
	if list[0].ID != IDPrefix+bad || !strings.Contains(list[0].Err, "digest mismatch") {
		t.Errorf("list[0] = %+v", list[0])
	}
	if list[1].ID != ids[1] || list[2].ID != ids[0] || list[1].Err != "" || list[2].Manifest.Function != "hello" {
		t.Errorf("list = %+v", list[1:])
	}

	m, err := Stat(ctx, store, ids[0])
	if err != nil || m.Function != "hello" {
		t.Fatalf("Stat = %+v, %v", m, err)
	}
	if _, err := Stat(ctx, store, IDPrefix+bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Stat of damaged manifest: %v", err)
	}
	if _, err := Stat(ctx, store, "nope"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Stat of bad id: %v", err)
	}

	if err := Delete(ctx, store, ids[0]); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(store.keys(), m.DataKey) || slices.Contains(store.keys(), ManifestPrefix+strings.TrimPrefix(ids[0], IDPrefix)) {
		t.Errorf("Delete left %v", store.keys())
	}
	if err := Delete(ctx, store, ids[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
	if _, err := Stat(ctx, store, ids[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after Delete: %v, want ErrNotFound", err)
	}
	if err := Delete(ctx, store, IDPrefix+bad); err != nil {
		t.Errorf("Delete of damaged manifest: %v", err)
	}
	list, err = List(ctx, store)
	if err != nil || len(list) != 1 || list[0].ID != ids[1] {
		t.Errorf("List after deletes = %+v, %v", list, err)
	}
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	store, key := newMemStore(), testKey(t, 1)
	id, m, _, err := Write(ctx, store, key, testOptions(LZ4), produceFiles(testFiles(true, 1000)))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	store.setModTime(m.DataKey, old) // referenced: kept however old
	orphanOld, orphanNew := DataPrefix+"0123456789abcdef0123456789abcdef", DataPrefix+"fedcba9876543210fedcba9876543210"
	store.set(orphanOld, []byte("left by a dead write"))
	store.setModTime(orphanOld, old)
	store.set(orphanNew, []byte("a write in flight"))
	// A manifest of a newer format still protects its data.
	future := DataPrefix + "99999999999999999999999999999999"
	store.set(future, []byte("newer image"))
	store.setModTime(future, old)
	store.set(ManifestPrefix+strings.Repeat("9", 64), []byte(`{"format":2,"data_key":"`+future+`","new_field":true}`))

	removed, err := GC(ctx, store, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{orphanOld}) {
		t.Fatalf("GC removed %v, want only %s", removed, orphanOld)
	}
	keys := store.keys()
	for _, k := range []string{m.DataKey, orphanNew, future} {
		if !slices.Contains(keys, k) {
			t.Errorf("GC removed %s", k)
		}
	}
	if _, _, err := Read(ctx, store, key, id, newDir(t), node); err != nil {
		t.Errorf("image unreadable after GC: %v", err)
	}
	if removed, err := GC(ctx, store, time.Now().Add(-time.Hour)); err != nil || len(removed) != 0 {
		t.Errorf("second GC = %v, %v", removed, err)
	}
}
