// Package blob owns the interface to the object stores that hold snapshot
// images (and, later, anything else too large for JetStream): a local
// directory for one node, or any S3-compatible store for a cluster. It knows
// nothing about what the bytes mean; the snapshot package does.
//
// Every backend passes the one conformance suite in package blobtest.
package blob

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Store is an object store with immutable, whole-object writes.
//
// Put is atomic: an object becomes visible (to Get, Stat and List) only when
// the whole stream was read and stored; if r fails, ctx is cancelled or the
// process dies half way, no object (and no partial object) is visible under
// key. A Put to an existing key replaces it atomically; when several Puts to
// one key race, the object ends up as exactly one of them.
//
// Missing keys are errdefs.ErrNotFound errors, keys that fail ValidateKey
// errdefs.ErrInvalid ones. A store on a file system cannot hold both "a" and
// "a/b" (a file cannot also be a directory): it refuses the second with an
// errdefs.ErrConflict error, and callers that need both must pick other keys.
type Store interface {
	// Put streams r into the object key. size is the exact length if known,
	// or -1; backends may use it to choose a single upload over multipart.
	// A stream whose length differs from a known size is an ErrInvalid
	// error and stores nothing; a failing r or ctx fails Put with an error
	// that wraps r's error or ctx's.
	Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error)
	// Get opens the object for reading. The reader must be closed.
	Get(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// GetRange opens length bytes of the object from offset; length < 0
	// means to the end. A range past the end is an ErrInvalid error (see
	// CheckRange); an empty range at the end is not.
	GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)
	// Stat returns the object's metadata.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the object. Deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the objects whose keys start with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]Info, error)
}

// Info describes one stored object.
type Info struct {
	Key     string    `json:"key"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

// MaxKeyLen bounds keys so that every backend (S3 allows 1024 bytes, file
// systems 255 per path element) can store any valid key.
const MaxKeyLen = 512

// ValidateKey checks that key is a relative, slash-separated path of
// [A-Za-z0-9._-] elements, none empty, "." or "..". Backends call it on every
// key they are given, so that no key can name a file outside a local store.
func ValidateKey(key string) error {
	if key == "" {
		return errdefs.Invalid("blob key is empty")
	}
	if len(key) > MaxKeyLen {
		return errdefs.Invalid(fmt.Sprintf("blob key %.40q… is %d bytes; the limit is %d", key, len(key), MaxKeyLen))
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return errdefs.Invalid(fmt.Sprintf("blob key %q: empty, \".\" or \"..\" path element", key))
		}
		for _, c := range el {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
			if !ok {
				return errdefs.Invalid(fmt.Sprintf("blob key %q: character %q not allowed (use A-Z a-z 0-9 . _ - and /)", key, c))
			}
		}
	}
	return nil
}

// ValidatePrefix checks a List prefix: empty, or the start of a valid key
// (it may end in "/" or part-way through an element).
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	probe := strings.TrimSuffix(prefix, "/")
	if probe == prefix {
		// Part-way through an element, which may go on: "a/." can start
		// the key "a/.x", so complete it before checking.
		if el := probe[strings.LastIndex(probe, "/")+1:]; el == "." || el == ".." {
			probe += "x"
		}
	}
	if err := ValidateKey(probe); err != nil {
		return errdefs.Invalid(fmt.Sprintf("blob key prefix %q cannot start a valid key: %v", prefix, err))
	}
	return nil
}

// CheckRange checks a GetRange request against an object of size bytes: the
// range must start in [0, size] and, when length >= 0, end at or before size.
// It returns the number of bytes the range holds.
func CheckRange(key string, offset, length, size int64) (int64, error) {
	switch {
	case offset < 0:
		return 0, errdefs.Invalid(fmt.Sprintf("blob %s: range offset %d is negative", key, offset))
	case offset > size:
		return 0, errdefs.Invalid(fmt.Sprintf("blob %s: range offset %d is past the end (size %d)", key, offset, size))
	case length < 0:
		return size - offset, nil
	case length > size-offset:
		return 0, errdefs.Invalid(fmt.Sprintf("blob %s: range %d+%d is past the end (size %d)", key, offset, length, size))
	}
	return length, nil
}

// ContextReader returns a reader that fails with ctx's error once ctx ends,
// so that a Put copying from a live stream stops at the next Read after its
// caller gives up. It cannot interrupt a Read that is already blocked.
func ContextReader(ctx context.Context, r io.Reader) io.Reader {
	return ctxReader{ctx: ctx, r: r}
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
