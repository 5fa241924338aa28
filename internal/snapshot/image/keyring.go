package image

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// KeySize is the size of a key LoadOrCreateKey creates, and the least it
// accepts.
const KeySize = 32

// maxKeyFile bounds what LoadOrCreateKey reads, so that a wrong path (a log
// file, a device) fails fast.
const maxKeyFile = 4096

// signContext separates manifest signatures from any other use of the key.
const signContext = "torpor snapshot manifest v1\n"

// Keyring holds the cluster key that signs and verifies manifests. Every
// node of a cluster must have the same key: an image signed with another
// key is refused.
type Keyring struct {
	key []byte
	id  string
}

// NewKeyring returns a Keyring for key, which must be at least KeySize
// random bytes. The key is copied.
func NewKeyring(key []byte) (*Keyring, error) {
	if len(key) < KeySize {
		return nil, errdefs.Invalid(fmt.Sprintf("snapshot signing key is %d bytes: it must be at least %d random bytes", len(key), KeySize))
	}
	sum := sha256.Sum256(key)
	return &Keyring{key: append([]byte(nil), key...), id: hex.EncodeToString(sum[:])[:12]}, nil
}

// ID names the key without revealing it: the first 12 hex digits of its
// sha256. Manifests carry it, so that a mismatch says which keys differ.
func (k *Keyring) ID() string { return k.id }

// Sign returns the HMAC-SHA256 of msg.
func (k *Keyring) Sign(msg []byte) []byte {
	mac := hmac.New(sha256.New, k.key)
	mac.Write([]byte(signContext))
	mac.Write(msg)
	return mac.Sum(nil)
}

// Verify reports whether mac is Sign(msg), in constant time.
func (k *Keyring) Verify(msg, mac []byte) bool { return hmac.Equal(k.Sign(msg), mac) }

// SignManifest sets m's KeyID and Signature and returns the bytes to store
// and the snapshot ID they make.
func (k *Keyring) SignManifest(m *Manifest) (stored []byte, id string, err error) {
	m.KeyID = k.id
	canon, err := m.canonical()
	if err != nil {
		return nil, "", err
	}
	m.Signature = hex.EncodeToString(k.Sign(canon))
	stored, err = m.encode()
	if err != nil {
		return nil, "", err
	}
	return stored, idOf(stored), nil
}

// VerifyManifest checks m's signature; id only names the snapshot in the
// error, which is ErrBadSignature.
func (k *Keyring) VerifyManifest(id string, m Manifest) error {
	if m.KeyID != k.id {
		return refuse(ErrBadSignature, nil, "snapshot %s: signed with key %s, this node has key %s: every node of a cluster needs the same key file", id, m.KeyID, k.id)
	}
	mac, err := hex.DecodeString(m.Signature)
	if err != nil || len(mac) != sha256.Size {
		return refuse(ErrBadSignature, nil, "snapshot %s: the signature is missing or malformed", id)
	}
	canon, err := m.canonical()
	if err != nil {
		return err
	}
	if !k.Verify(canon, mac) {
		return refuse(ErrBadSignature, nil, "snapshot %s: the signature does not match the manifest (key %s): the manifest was modified", id, k.id)
	}
	return nil
}

// LoadOrCreateKey loads the key at path, or creates it (KeySize random
// bytes, mode 0600, atomically: nodes racing to create it all end up with
// the winner's key) if there is no file. It refuses a key file that group
// or others may read, or that holds fewer than KeySize bytes, saying how to
// fix it. In a cluster, create the key once and copy it to every node.
func LoadOrCreateKey(path string) (*Keyring, error) {
	k, err := loadKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := createKey(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return loadKey(path)
}

func loadKey(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot signing key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("snapshot signing key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, errdefs.Invalid(fmt.Sprintf("snapshot signing key %s is not a regular file (%v): point the key path at a file of %d random bytes", path, st.Mode().Type(), KeySize))
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, errdefs.Invalid(fmt.Sprintf("snapshot signing key %s has mode %#o, so group or others can read it: run `chmod 600 %s` (and replace the key on every node if someone may have read it)", path, perm, path))
	}
	key, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot signing key %s: %w", path, err)
	}
	if len(key) > maxKeyFile {
		return nil, errdefs.Invalid(fmt.Sprintf("snapshot signing key %s is larger than %d bytes: is the path right?", path, maxKeyFile))
	}
	if len(key) < KeySize {
		return nil, errdefs.Invalid(fmt.Sprintf("snapshot signing key %s holds %d bytes, fewer than %d: replace it with `head -c %d /dev/urandom > %s` on one node and copy it to all, or delete it to have one created", path, len(key), KeySize, KeySize, path))
	}
	return NewKeyring(key)
}

// createKey writes a new key to a temporary file and links it to path, so
// that path appears complete or not at all, and an existing key (another
// process won the race) is never replaced: then it returns fs.ErrExist.
func createKey(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create snapshot signing key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".snapshot-key-*") // mode 0600
	if err != nil {
		return fmt.Errorf("create snapshot signing key: %w", err)
	}
	defer os.Remove(tmp.Name())
	key := make([]byte, KeySize)
	rand.Read(key) // never fails (crypto/rand since Go 1.24)
	_, err = tmp.Write(key)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create snapshot signing key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("create snapshot signing key: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
