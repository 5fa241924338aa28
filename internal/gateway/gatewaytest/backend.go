// Package gatewaytest provides an in-memory test double of gateway.Backend,
// so that the gateway, the client and the CLI can be tested over real HTTP
// without NATS or workers. The real backend has its own end-to-end tests;
// nothing outside tests may import this package.
package gatewaytest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Backend is an in-memory test double of gateway.Backend. Its "handler"
// echoes the event as {"echo":EVENT}; the event {"raise":"T"} makes it fail
// with error type T. SetErr makes every method fail. The exported fields
// may be read or set by a test while no request is in flight.
type Backend struct {
	mu  sync.Mutex
	err error

	// Fns holds the versions of every function, oldest first.
	Fns map[string][]function.Version
	// Records holds every call record by id.
	Records map[string]function.Call
	// LogLines are the stored log lines of each function.
	LogLines map[string][]function.LogLine
	// LogTail is what a call with LogTail set returns as its log tail.
	LogTail []byte
	// Invokes records every Invoke and InvokeAsync request, in order.
	Invokes []function.InvokeRequest
	// Asyncs counts the accepted InvokeAsync calls.
	Asyncs   int
	nextCall int
	// Follow, when set, delivers the lines a following Logs sends after the
	// stored ones.
	Follow chan function.LogLine
}

// NewBackend returns an empty Backend.
func NewBackend() *Backend {
	return &Backend{
		Fns:      map[string][]function.Version{},
		Records:  map[string]function.Call{},
		LogLines: map[string][]function.LogLine{},
	}
}

// SetErr makes every method fail with err (nil restores normal service).
func (f *Backend) SetErr(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// LastInvoke returns the last invoke request (zero if none).
func (f *Backend) LastInvoke() function.InvokeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.Invokes) == 0 {
		return function.InvokeRequest{}
	}
	return f.Invokes[len(f.Invokes)-1]
}

func (f *Backend) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func notFound(name string) error {
	return fmt.Errorf("function %q: %w", name, errdefs.ErrNotFound)
}

func (f *Backend) Deploy(ctx context.Context, spec function.Spec, code []byte) (function.Version, error) {
	if err := f.fail(); err != nil {
		return function.Version{}, err
	}
	if err := spec.Normalize(); err != nil {
		return function.Version{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sum := sha256.Sum256(code)
	v := function.Version{
		Spec: spec, Version: len(f.Fns[spec.Name]) + 1, CodeDigest: hex.EncodeToString(sum[:]),
		CodeSize: int64(len(code)), UID: 10000, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	f.Fns[spec.Name] = append(f.Fns[spec.Name], v)
	return v, nil
}

func (f *Backend) Function(ctx context.Context, name string, v int) (function.Version, error) {
	if err := f.fail(); err != nil {
		return function.Version{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs := f.Fns[name]
	switch {
	case len(vs) == 0:
		return function.Version{}, notFound(name)
	case v == 0:
		return vs[len(vs)-1], nil
	case v > len(vs):
		return function.Version{}, fmt.Errorf("function %q version %d: %w", name, v, errdefs.ErrNotFound)
	}
	return vs[v-1], nil
}

func (f *Backend) Functions(ctx context.Context) ([]function.Version, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []function.Version
	for _, vs := range f.Fns {
		out = append(out, vs[len(vs)-1])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *Backend) DeleteFunction(ctx context.Context, name string) error {
	if err := f.fail(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Fns[name]; !ok {
		return notFound(name)
	}
	delete(f.Fns, name)
	return nil
}

// run executes the fake handler and records a call.
func (f *Backend) run(req function.InvokeRequest, mode string) (function.Call, function.InvokeResult, error) {
	if err := f.fail(); err != nil {
		return function.Call{}, function.InvokeResult{}, err
	}
	v, err := f.Function(context.Background(), req.Function, req.Version)
	if err != nil {
		return function.Call{}, function.InvokeResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Invokes = append(f.Invokes, req)
	f.nextCall++
	res := function.InvokeResult{
		CallID: "call-" + strconv.Itoa(f.nextCall), Version: v.Version, Start: function.StartWarm,
		StartTime: 1500 * time.Microsecond, Duration: 12 * time.Millisecond,
	}
	var ev struct {
		Raise string `json:"raise"`
	}
	_ = json.Unmarshal(req.Payload, &ev)
	if ev.Raise != "" {
		res.Err = &function.Error{ErrorMessage: "boom", ErrorType: ev.Raise, StackTrace: []string{`File "app.py", line 3, in handler`}}
	} else {
		res.Payload = append(append([]byte(`{"echo":`), bytes.TrimSpace(req.Payload)...), '}')
	}
	if req.LogTail {
		res.LogTail = f.LogTail
	}
	call := function.Call{
		ID: res.CallID, Function: req.Function, Version: v.Version, Mode: mode,
		Status: function.StatusQueued, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if mode == "sync" {
		call.Status = function.StatusSucceeded
		call.Result = res.Payload
		if res.Err != nil {
			call.Status = function.StatusFailed
			call.Error = res.Err
		}
	}
	f.Records[call.ID] = call
	return call, res, nil
}

func (f *Backend) Invoke(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error) {
	_, res, err := f.run(req, "sync")
	return res, err
}

func (f *Backend) InvokeAsync(ctx context.Context, req function.InvokeRequest) (function.Call, error) {
	call, _, err := f.run(req, "async")
	if err == nil {
		f.mu.Lock()
		f.Asyncs++
		f.mu.Unlock()
	}
	return call, err
}

func (f *Backend) Call(ctx context.Context, id string) (function.Call, error) {
	if err := f.fail(); err != nil {
		return function.Call{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.Records[id]
	if !ok {
		return c, fmt.Errorf("call %q: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (f *Backend) Calls(ctx context.Context, name string, limit int) ([]function.Call, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Fns[name]; !ok {
		return nil, notFound(name)
	}
	var out []function.Call
	for _, c := range f.Records {
		if c.Function == name {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (f *Backend) Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error {
	if err := f.fail(); err != nil {
		return err
	}
	f.mu.Lock()
	lines := append([]function.LogLine(nil), f.LogLines[name]...)
	ch := f.Follow
	f.mu.Unlock()
	for _, l := range lines {
		if err := fn(l); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l := <-ch:
			if err := fn(l); err != nil {
				return err
			}
		}
	}
}
