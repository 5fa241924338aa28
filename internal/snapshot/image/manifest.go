package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/snapshot/archive"
)

// FormatVersion is the manifest format this package writes and reads. A
// reader refuses other versions as ErrIncompatible.
const FormatVersion = 1

// Compression names the codec of an image's data.
type Compression string

// The codecs. Zstd compresses better, LZ4 decompresses faster; None is for
// data that does not compress and for tests.
const (
	Zstd Compression = "zstd"
	LZ4  Compression = "lz4"
	None Compression = "none"
)

func (c Compression) valid() bool { return c == Zstd || c == LZ4 || c == None }

// FileEntry is one file of an image as the manifest lists it.
type FileEntry struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Manifest describes one image. It is stored as JSON; the Signature is an
// HMAC-SHA256 by the cluster key over the canonical JSON of the manifest
// with Signature empty (see Keyring).
type Manifest struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// Function and FunctionVersion name what was snapshotted.
	Function        string `json:"function"`
	FunctionVersion int    `json:"function_version"`
	// Runtime is the language runtime and its version, e.g. "python 3.11.7";
	// an image restores only into the very same runtime.
	Runtime string `json:"runtime"`
	// CRIUVersion is the version of the CRIU that dumped, e.g. "4.0".
	CRIUVersion string `json:"criu_version"`
	// Kernel is the dumping node's kernel release (uname -r).
	Kernel string `json:"kernel"`
	// Arch is the GOARCH-style architecture, e.g. "amd64".
	Arch      string    `json:"arch"`
	CreatedAt time.Time `json:"created_at"`
	// Compression is the codec of the data object.
	Compression Compression `json:"compression"`
	// DataKey is the blob key of the data object.
	DataKey string `json:"data_key"`
	// DataSize and DataSHA256 (hex) describe the data object as stored.
	DataSize   int64  `json:"data_size"`
	DataSHA256 string `json:"data_sha256"`
	// RawSize is the size of the archive before compression.
	RawSize int64 `json:"raw_size"`
	// Files lists the image files, sorted by name.
	Files []FileEntry `json:"files"`
	// MemoryBytes is the memory the snapshotted process tree used; the
	// caller fills it in (the scheduler uses it to place restores).
	MemoryBytes int64             `json:"memory_bytes,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// KeyID names the key that signed (Keyring.ID).
	KeyID string `json:"key_id"`
	// Signature is the hex HMAC-SHA256 (see Keyring.SignManifest).
	Signature string `json:"signature,omitempty"`
}

// canonical returns the bytes the signature covers: the JSON of m with
// Signature empty. encoding/json writes struct fields in declaration order
// and map keys sorted, so the same manifest always gives the same bytes;
// Read recomputes them from the manifest it parsed, so what is verified is
// exactly what is used.
func (m Manifest) canonical() ([]byte, error) {
	m.Signature = ""
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot manifest: %w", err)
	}
	return b, nil
}

// parseManifest decodes stored manifest bytes strictly: unknown fields or
// trailing data mean a format this build does not know, or tampering.
func parseManifest(id string, b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, refuse(ErrCorrupt, err, "snapshot %s: manifest does not decode", id)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Manifest{}, refuse(ErrCorrupt, nil, "snapshot %s: data after the manifest JSON", id)
	}
	return m, nil
}

// validate checks the fields Read relies on. It runs after the signature
// check, so it guards against our own bugs and other versions more than
// against attackers.
func (m *Manifest) validate(id string) error {
	bad := func(format string, args ...any) error {
		return refuse(ErrCorrupt, nil, "snapshot %s: manifest: "+format, append([]any{id}, args...)...)
	}
	if m.Format != FormatVersion {
		return refuse(ErrIncompatible, nil, "snapshot %s: manifest format %d is not supported: this node reads format %d", id, m.Format, FormatVersion)
	}
	if !m.Compression.valid() {
		return refuse(ErrIncompatible, nil, "snapshot %s: compression %q is not supported (want zstd, lz4 or none)", id, m.Compression)
	}
	if !strings.HasPrefix(m.DataKey, DataPrefix) || blob.ValidateKey(m.DataKey) != nil {
		return bad("data key %q is not under %s", m.DataKey, DataPrefix)
	}
	if m.DataSize < 0 || m.RawSize < 0 {
		return bad("negative size")
	}
	if len(m.DataSHA256) != sha256.Size*2 || !isHex(m.DataSHA256) {
		return bad("data_sha256 %q is not 64 hex digits", m.DataSHA256)
	}
	var total int64
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if !archive.ValidName(f.Name) || seen[f.Name] || f.Size < 0 {
			return bad("file %q is invalid, repeated or has a negative size", f.Name)
		}
		seen[f.Name] = true
		total += f.Size
		if total > m.RawSize {
			return bad("the files add up to more than raw_size %d", m.RawSize)
		}
	}
	return nil
}

// encode returns the JSON to store: the signed manifest.
func (m Manifest) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot manifest: %w", err)
	}
	return b, nil
}

func hexSum(sum []byte) string { return hex.EncodeToString(sum) }
