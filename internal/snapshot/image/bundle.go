package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// A bundle carries one stored image as a single stream, for moving it
// between stores or clusters (torpor snapshot export / import):
//
//	"TORPSNAP" 0x01 | uvarint manifest length | the stored manifest bytes | the data object
//
// The manifest travels byte for byte, so the snapshot keeps its ID, and
// Import verifies it exactly as Read does (digest, signature, data digest)
// before the image becomes visible.
const bundleMagic = "TORPSNAP\x01"

// BundleSize is the length of the bundle of a stored image.
func BundleSize(ctx context.Context, store blob.Store, id string) (int64, error) {
	b, m, err := storedManifest(ctx, store, id)
	if err != nil {
		return 0, err
	}
	return int64(len(bundleMagic)+uvarintLen(uint64(len(b)))+len(b)) + m.DataSize, nil
}

func uvarintLen(v uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], v)
}

func storedManifest(ctx context.Context, store blob.Store, id string) ([]byte, Manifest, error) {
	h, err := parseID(id)
	if err != nil {
		return nil, Manifest{}, err
	}
	b, err := getManifest(ctx, store, h)
	if err != nil {
		return nil, Manifest{}, err
	}
	if idOf(b) != IDPrefix+h {
		return nil, Manifest{}, refuse(ErrCorrupt, nil, "snapshot %s: manifest digest mismatch (the stored manifest was modified)", id)
	}
	m, err := parseManifest(id, b)
	return b, m, err
}

// Export writes the bundle of image id to w.
func Export(ctx context.Context, store blob.Store, id string, w io.Writer) error {
	b, m, err := storedManifest(ctx, store, id)
	if err != nil {
		return err
	}
	rc, _, err := store.Get(ctx, m.DataKey)
	if err != nil {
		return fmt.Errorf("export %s: data: %w", id, err)
	}
	defer rc.Close()
	var hdr [len(bundleMagic) + binary.MaxVarintLen64]byte
	n := copy(hdr[:], bundleMagic)
	n += binary.PutUvarint(hdr[n:], uint64(len(b)))
	if _, err := w.Write(hdr[:n]); err != nil {
		return fmt.Errorf("export %s: %w", id, err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("export %s: %w", id, err)
	}
	copied, err := io.Copy(w, blob.ContextReader(ctx, rc))
	if err != nil {
		return fmt.Errorf("export %s: %w", id, err)
	}
	if copied != m.DataSize {
		return refuse(ErrTruncated, nil, "export %s: the stored data is %d bytes, the manifest says %d", id, copied, m.DataSize)
	}
	return nil
}

// Import reads a bundle from r, verifies it with key (manifest digest,
// signature, format, data size and digest) and stores it. It returns the
// snapshot's ID, which is the one it had where it was exported. A bundle
// that fails verification stores nothing.
func Import(ctx context.Context, store blob.Store, key *Keyring, r io.Reader) (string, Manifest, error) {
	br := bufio.NewReader(r)
	magic := make([]byte, len(bundleMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != bundleMagic {
		return "", Manifest{}, errdefs.Invalid("import: not a torpor snapshot bundle (made by `torpor snapshot export`)")
	}
	n, err := binary.ReadUvarint(br)
	if err != nil || n == 0 || n > MaxManifestBytes {
		return "", Manifest{}, refuse(ErrCorrupt, err, "import: bad manifest length %d", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return "", Manifest{}, refuse(ErrTruncated, err, "import: the bundle ends inside the manifest")
	}
	id := idOf(b)
	m, err := parseManifest(id, b)
	if err != nil {
		return "", Manifest{}, err
	}
	if err := key.VerifyManifest(id, m); err != nil {
		return "", Manifest{}, err
	}
	if err := m.validate(id); err != nil {
		return "", Manifest{}, err
	}
	h := sha256.New()
	data := io.TeeReader(io.LimitReader(br, m.DataSize), h)
	info, err := store.Put(ctx, m.DataKey, data, m.DataSize)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalid) {
			return "", Manifest{}, refuse(ErrTruncated, err, "import %s: the bundle holds less data than the manifest's %d bytes", id, m.DataSize)
		}
		return "", Manifest{}, fmt.Errorf("import %s: store data: %w", id, err)
	}
	if info.Size != m.DataSize || hex.EncodeToString(h.Sum(nil)) != m.DataSHA256 {
		_ = store.Delete(context.WithoutCancel(ctx), m.DataKey)
		return "", Manifest{}, refuse(ErrCorrupt, nil, "import %s: the data does not match the manifest's digest", id)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		_ = store.Delete(context.WithoutCancel(ctx), m.DataKey)
		return "", Manifest{}, refuse(ErrCorrupt, nil, "import %s: bytes after the data", id)
	}
	if _, err := store.Put(ctx, manifestKey(id[len(IDPrefix):]), bytes.NewReader(b), int64(len(b))); err != nil {
		_ = store.Delete(context.WithoutCancel(ctx), m.DataKey)
		return "", Manifest{}, fmt.Errorf("import %s: store manifest: %w", id, err)
	}
	return id, m, nil
}
