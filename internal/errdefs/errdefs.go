// Package errdefs holds the few error classes torpor uses to classify
// failures. Packages wrap one of these sentinels (fmt.Errorf("...: %w",
// errdefs.ErrNotFound)); only the gateway maps them to HTTP status codes.
// It must not import any other torpor package.
package errdefs

import "errors"

// The error classes. Check them with errors.Is.
var (
	// ErrNotFound: the named thing (function, version, call) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request itself is wrong; retrying it unchanged fails again.
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict: the request clashes with the current state (e.g. concurrent update).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: a dependency (worker, NATS, store) cannot serve now; retry later.
	ErrUnavailable = errors.New("unavailable")
	// ErrTooLarge: a payload or package exceeds a limit.
	ErrTooLarge = errors.New("too large")
	// ErrTimeout: the operation did not finish in time.
	ErrTimeout = errors.New("timeout")
	// ErrThrottled: a concurrency limit was reached; retry later.
	ErrThrottled = errors.New("throttled")
)

// Invalid wraps msg as an ErrInvalid error.
func Invalid(msg string) error { return &classed{msg: msg, class: ErrInvalid} }

// NotFound wraps msg as an ErrNotFound error.
func NotFound(msg string) error { return &classed{msg: msg, class: ErrNotFound} }

// TooLarge wraps msg as an ErrTooLarge error.
func TooLarge(msg string) error { return &classed{msg: msg, class: ErrTooLarge} }

// classed is an error whose message stands alone (no ": not found" suffix)
// but which still matches its class with errors.Is.
type classed struct {
	msg   string
	class error
}

func (e *classed) Error() string        { return e.msg }
func (e *classed) Is(target error) bool { return target == e.class }
