package image

import (
	"errors"
	"fmt"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// sentinel is an image error class. It unwraps to errdefs.ErrInvalid, so
// that code which only knows the general classes treats a refused image as
// a bad request that must not be retried unchanged.
type sentinel struct{ msg string }

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return errdefs.ErrInvalid }

// The reasons Read refuses an image. Each also matches errdefs.ErrInvalid
// with errors.Is. A refused image must never reach CRIU; the caller falls
// back to a cold start (and may delete the snapshot).
var (
	// ErrCorrupt: the manifest or the data does not match its digest, or
	// does not decode.
	ErrCorrupt error = &sentinel{"snapshot image is corrupt"}
	// ErrTruncated: the data object is shorter than the manifest says.
	ErrTruncated error = &sentinel{"snapshot image is truncated"}
	// ErrBadSignature: the manifest was not signed with this node's key.
	ErrBadSignature error = &sentinel{"snapshot manifest signature is not valid"}
	// ErrIncompatible: the image was made on a node this one cannot restore
	// (other architecture or runtime, newer kernel or CRIU, newer format).
	ErrIncompatible error = &sentinel{"snapshot image is incompatible with this node"}
)

// IsRefused reports whether err says that an image was refused (corrupt,
// truncated, badly signed or incompatible), as opposed to a failure to
// reach the store or a cancelled context.
func IsRefused(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTruncated) ||
		errors.Is(err, ErrBadSignature) || errors.Is(err, ErrIncompatible)
}

// classed is an error whose message stands alone, which matches its class
// (and whatever the class matches) and unwraps to its cause.
type classed struct {
	msg   string
	class error
	cause error
}

func (e *classed) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *classed) Is(target error) bool { return target == e.class || errors.Is(e.class, target) }
func (e *classed) Unwrap() error        { return e.cause }

// refuse returns an error of class (one of the sentinels or errdefs
// classes) with a message of its own and an optional cause.
func refuse(class, cause error, format string, args ...any) error {
	return &classed{msg: fmt.Sprintf(format, args...), class: class, cause: cause}
}
