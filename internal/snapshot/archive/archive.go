// Package archive owns torpor's multiplexed streaming archive: the container
// that carries the image files of one CRIU dump as a single byte stream.
//
// CRIU in --stream mode hands over one pipe per image file and writes several
// of them at once (pagemap-N.img and pages-N.img interleave), so a format
// that stores files one after another (tar, zip) would need the whole image
// on disk first. Here each file is cut into records of at most MaxChunk
// bytes, tagged with a small file id, and records of different files are
// interleaved on the one stream as they are written. Extract decodes such a
// stream into a flat directory and checks every byte, because on restore the
// stream comes from an object store that tenants may have touched, and the
// files end up in front of a CRIU running as root.
//
// The package knows nothing about compression, signing or where the stream
// goes (package image does that); it must not import any torpor package but
// errdefs and blob (for blob.ContextReader).
//
// # Format (version 1)
//
// All integers are unsigned LEB128 varints (encoding/binary Uvarint) unless
// noted. A stream is:
//
//	header   magic "\x89TORPAR\n" (8 bytes), version byte 0x01
//	records  any number of:
//	  'F' id name-len name mode   a file is opened: ids count 1, 2, 3, … in
//	                              the order files are opened; name matches
//	                              [A-Za-z0-9._-]{1,255} and is not "." or
//	                              ".."; mode holds permission bits only
//	                              (≤ 0o777)
//	  'D' id len data             len (1 … MaxChunk) bytes of file id, which
//	                              must be open
//	  'E' id size sha256          file id is complete: size is its total
//	                              length, sha256 its 32-byte digest (raw),
//	                              or 32 zero bytes when not recorded
//	                              (Writer.SkipDigests)
//	trailer  'T' files bytes     the number of files and their total size;
//	                              the stream must end right after it
//
// Every file opened must be ended before the trailer; an id is never reused.
// A stream that ends early, has an unknown record type, a duplicate or
// invalid name, a record for an unknown or already ended id, or a size,
// digest or count that does not add up is rejected with an
// errdefs.ErrInvalid error that says what and at which offset.
package archive

import (
	"crypto/sha256"
	"fmt"
	"io/fs"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// MaxChunk bounds the data of one record. The writer cuts larger writes, so
// that files written at the same time share the stream fairly and a reader
// never needs more than one chunk of buffer.
const MaxChunk = 1 << 20

// MaxNameLen is the longest file name the format allows (a file system's
// limit for one path element).
const MaxNameLen = 255

// Version is the format version this package writes and reads.
const Version = 1

// magic starts every archive; the high byte and the newline catch text-mode
// mangling, as PNG's signature does.
const magic = "\x89TORPAR\n"

// Record types.
const (
	recFile    = 'F'
	recData    = 'D'
	recEnd     = 'E'
	recTrailer = 'T'
)

// FileInfo describes one file of an archive.
type FileInfo struct {
	Name   string
	Size   int64
	Mode   fs.FileMode // permission bits only
	SHA256 [sha256.Size]byte
}

// ValidName reports whether name is allowed as an archive file name: one
// path element of [A-Za-z0-9._-], not "." or "..", at most MaxNameLen bytes.
// CRIU's image names (core-1.img, pages-3.img, …) all fit.
func ValidName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// checkName returns an ErrInvalid error naming what is wrong with name.
func checkName(name string) error {
	if ValidName(name) {
		return nil
	}
	return errdefs.Invalid(fmt.Sprintf("archive file name %.80q is not allowed: use 1 to %d characters of A-Z a-z 0-9 . _ - (no slashes, not \".\" or \"..\")", name, MaxNameLen))
}
