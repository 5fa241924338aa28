package image

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestExportImport(t *testing.T) {
	ctx := context.Background()
	w := writeImage(t, Zstd)
	var bundle bytes.Buffer
	if err := Export(ctx, w.store, w.id, &bundle); err != nil {
		t.Fatal(err)
	}
	size, err := BundleSize(ctx, w.store, w.id)
	if err != nil || size != int64(bundle.Len()) {
		t.Fatalf("BundleSize = %d, %v; the bundle is %d bytes", size, err, bundle.Len())
	}
	good := bundle.Bytes()

	// Into another store of the same cluster: same ID, readable.
	dst := newMemStore()
	id, _, err := Import(ctx, dst, w.key, bytes.NewReader(good))
	if err != nil || id != w.id {
		t.Fatalf("Import = %s, %v; want %s", id, err, w.id)
	}
	if _, _, err := Read(ctx, dst, w.key, id, t.TempDir(), node); err != nil {
		t.Fatalf("Read of the imported image: %v", err)
	}

	tests := []struct {
		name   string
		bundle func() []byte
		key    *Keyring
		class  error
	}{
		{"not a bundle", func() []byte { return []byte("PK\x03\x04 a zip") }, w.key, errdefs.ErrInvalid},
		{"truncated manifest", func() []byte { return good[:20] }, w.key, ErrTruncated},
		{"truncated data", func() []byte { return good[:len(good)-10] }, w.key, ErrTruncated},
		{"trailing bytes", func() []byte { return append(bytes.Clone(good), 0) }, w.key, ErrCorrupt},
		{"flipped data byte", func() []byte { return flip(bytes.Clone(good), len(good)-100) }, w.key, ErrCorrupt},
		{"flipped manifest byte", func() []byte { return flip(bytes.Clone(good), len(bundleMagic)+40) }, w.key, nil},
		{"another cluster's key", func() []byte { return good }, testKey(t, 2), ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			_, _, err := Import(ctx, s, tt.key, bytes.NewReader(tt.bundle()))
			if err == nil {
				t.Fatal("Import succeeded")
			}
			if tt.class != nil && !errors.Is(err, tt.class) {
				t.Errorf("Import error %v, want %v", err, tt.class)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Import error %v is not ErrInvalid", err)
			}
			if list, _ := s.List(ctx, ""); len(list) != 0 {
				t.Errorf("refused import left %d objects", len(list))
			}
		})
	}
}
