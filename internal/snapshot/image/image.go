// Package image owns snapshot images in the blob store: the signed manifest
// that describes one CRIU dump, the compressed archive that carries its
// files, and the layout, listing and garbage collection of both. It turns a
// dump into a stored image in one streaming pass (Write: archive → compress
// → hash → upload, nothing on local disk) and back (Read: download → hash →
// decompress → extract), and it refuses, before anything reaches CRIU, any
// image whose bytes, signature or origin it cannot vouch for: CRIU restores
// as root, and tenants are hostile.
//
// It does not run CRIU, choose what to snapshot, or know which backend the
// blob.Store is; it must not import any torpor package but blob, errdefs and
// snapshot/archive.
//
// # Layout
//
// An image is two objects:
//
//	snapshots/data/<32 random hex digits>   the compressed archive
//	snapshots/manifests/<64 hex digits>     the manifest, named by its sha256
//
// The data is written first, streamed under a random name because its
// digest is known only at the end; the manifest is written last and is the
// commit point: data that no manifest names is garbage (GC removes it). The
// snapshot ID is "sha256:" + the manifest's hex name. Because the manifest
// names the data's size and sha256, the ID pins every byte of the image, and
// because the manifest carries an HMAC-SHA256 by the cluster key, only a
// node of the cluster can make an image that Read accepts.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Blob store key prefixes of the two objects of an image.
const (
	DataPrefix     = "snapshots/data/"
	ManifestPrefix = "snapshots/manifests/"
)

// IDPrefix starts every snapshot ID.
const IDPrefix = "sha256:"

// MaxManifestBytes bounds a manifest, which Read loads into memory before it
// can check anything.
const MaxManifestBytes = 4 << 20

// idOf returns the snapshot ID of the stored manifest bytes b.
func idOf(b []byte) string {
	sum := sha256.Sum256(b)
	return IDPrefix + hex.EncodeToString(sum[:])
}

// parseID returns the hex digest of a full snapshot ID ("sha256:" + 64 hex
// digits; the prefix may be left out).
func parseID(id string) (string, error) {
	h := trimIDPrefix(id)
	if len(h) != sha256.Size*2 || !isHex(h) {
		return "", errdefs.Invalid(fmt.Sprintf("snapshot id %.80q is not valid: want sha256:<64 lowercase hex digits> (use Resolve for a prefix)", id))
	}
	return h, nil
}

func trimIDPrefix(s string) string {
	if len(s) >= len(IDPrefix) && s[:len(IDPrefix)] == IDPrefix {
		return s[len(IDPrefix):]
	}
	return s
}

// isHex reports whether s is lowercase hex digits only.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func manifestKey(hexID string) string { return ManifestPrefix + hexID }
