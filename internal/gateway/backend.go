package gateway

import (
	"context"

	"github.com/torpor-dev/torpor/internal/function"
)

// Backend is everything the HTTP API needs from the control plane. The
// gateway only translates HTTP to these calls and errdefs classes to status
// codes; it holds no state of its own.
type Backend interface {
	// Deploy validates spec and the code zip, runs the function's init in a
	// sandbox (so a missing handler or a syntax error is rejected now, with the
	// Python traceback in an errdefs.ErrInvalid error) and stores a new version.
	Deploy(ctx context.Context, spec function.Spec, codeZip []byte) (function.Version, error)
	// Function returns version v of name, or the latest when v is 0.
	Function(ctx context.Context, name string, v int) (function.Version, error)
	// Functions lists the latest version of every function.
	Functions(ctx context.Context) ([]function.Version, error)
	// DeleteFunction removes a function and all its versions.
	DeleteFunction(ctx context.Context, name string) error
	// Invoke runs a call and waits for its result.
	Invoke(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error)
	// InvokeAsync persists the call durably and returns its record (status
	// queued); it returns only once the call cannot be lost.
	InvokeAsync(ctx context.Context, req function.InvokeRequest) (function.Call, error)
	// Call returns a call record.
	Call(ctx context.Context, id string) (function.Call, error)
	// Calls lists up to limit recent calls of a function, newest first;
	// ErrNotFound when the function does not exist.
	Calls(ctx context.Context, name string, limit int) ([]function.Call, error)
	// Logs sends the function's log lines to fn, oldest first; with follow it
	// keeps sending new lines until ctx is done.
	Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error
}
