package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestLoadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "snapshot.key")
	k, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() != KeySize {
		t.Errorf("key file mode %v size %d, want 0600 and %d", st.Mode().Perm(), st.Size(), KeySize)
	}
	if len(k.ID()) != 12 || !isHex(k.ID()) {
		t.Errorf("ID %q is not 12 hex digits", k.ID())
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || again.ID() != k.ID() {
		t.Fatalf("reload = %v, %v; want the same key", again, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("key dir holds %d entries, want the key only", len(ents))
	}
}

func TestLoadOrCreateKeyConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "snapshot.key")
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			k, err := LoadOrCreateKey(path)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = k.ID()
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("racing creators got different keys: %v", ids)
		}
	}
}

func TestLoadKeyRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string
	}{
		{"group readable", func(t *testing.T, path string) {
			os.WriteFile(path, bytes.Repeat([]byte{1}, KeySize), 0o600)
			os.Chmod(path, 0o640)
		}, "run `chmod 600 "},
		{"world readable", func(t *testing.T, path string) {
			os.WriteFile(path, bytes.Repeat([]byte{1}, KeySize), 0o600)
			os.Chmod(path, 0o604)
		}, "mode 0604"},
		{"short", func(t *testing.T, path string) {
			os.WriteFile(path, []byte("secret\n"), 0o600)
		}, "holds 7 bytes, fewer than 32: replace it with `head -c 32 /dev/urandom >"},
		{"empty", func(t *testing.T, path string) {
			os.WriteFile(path, nil, 0o600)
		}, "holds 0 bytes"},
		{"huge", func(t *testing.T, path string) {
			os.WriteFile(path, make([]byte, 10000), 0o600)
		}, "larger than 4096 bytes"},
		{"directory", func(t *testing.T, path string) {
			os.Mkdir(path, 0o700)
		}, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snapshot.key")
			tt.setup(t, path)
			k, err := LoadOrCreateKey(path)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadOrCreateKey = %v, %v; want ErrInvalid containing %q", k, err, tt.want)
			}
		})
	}
	t.Run("unwritable dir", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root writes anywhere")
		}
		dir := t.TempDir()
		os.Chmod(dir, 0o500)
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
		if _, err := LoadOrCreateKey(filepath.Join(dir, "k")); err == nil {
			t.Fatal("created a key in a read-only directory")
		}
	})
}

func TestKeyringSignVerify(t *testing.T) {
	if _, err := NewKeyring(make([]byte, KeySize-1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("short key: %v", err)
	}
	k1, k2 := testKey(t, 1), testKey(t, 2)
	if k1.ID() == k2.ID() {
		t.Fatal("different keys, same ID")
	}
	msg := []byte("manifest")
	mac := k1.Sign(msg)
	if !k1.Verify(msg, mac) || k2.Verify(msg, mac) || k1.Verify([]byte("manifesT"), mac) || k1.Verify(msg, mac[:31]) {
		t.Fatal("Verify accepts what it must not, or refuses what it must accept")
	}

	m := Manifest{Format: FormatVersion, Function: "f", Labels: map[string]string{"b": "2", "a": "1"}}
	stored, id, err := k1.SignManifest(&m)
	if err != nil {
		t.Fatal(err)
	}
	if id != idOf(stored) || m.KeyID != k1.ID() || m.Signature == "" {
		t.Fatalf("SignManifest: id %s, manifest %+v", id, m)
	}
	parsed, err := parseManifest(id, stored)
	if err != nil {
		t.Fatal(err)
	}
	if err := k1.VerifyManifest(id, parsed); err != nil {
		t.Fatalf("VerifyManifest of a round-tripped manifest: %v", err)
	}
	if err := k2.VerifyManifest(id, parsed); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("VerifyManifest with another key: %v", err)
	}
	// Signing is deterministic: the same manifest gives the same ID.
	m2 := m
	if _, id2, _ := k1.SignManifest(&m2); id2 != id {
		t.Errorf("re-signing changed the ID: %s vs %s", id2, id)
	}
}
