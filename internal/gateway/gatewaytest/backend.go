// Package gatewaytest provides an in-memory test double of gateway.Backend,
// so that the gateway, the client and the CLI can be tested over real HTTP
// without NATS or workers, and the conformance suite (RunBackendConformance)
// that both the double and the real backend pass, so that tests against the
// double mean something. Nothing outside tests may import this package.
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
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Backend is an in-memory test double of gateway.Backend. Code that is one
// of the recognised modules (EchoSource, RaiseSource, SyntaxErrorSource)
// behaves as the real backend runs it: its init can fail the deploy, its
// calls print log lines, and its async calls finish at once. Any other code
// gets a canned "handler" that echoes the event as {"echo":EVENT}, fails
// with error type T on the event {"raise":"T"}, prints nothing and leaves
// async calls queued. SetErr makes every method fail. The exported fields
// may be read or set by a test while no request is in flight.
// RunBackendConformance holds it to the real backend's behaviour.
type Backend struct {
	mu  sync.Mutex
	err error

	// Unexported state the exported fields do not show: the last version
	// number of each name (never reused, even after a delete), the program
	// of each version deployed with recognised code ("name@version"), the
	// order in which call records were written, and a channel closed and
	// replaced whenever the fake appends log lines (for followers).
	seq         map[string]int
	progs       map[string]*program
	callOrder   map[string]int
	logsChanged chan struct{}

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
	// Asyncs counts the accepted InvokeAsync calls (a retry with the id of
	// an accepted call is not counted again).
	Asyncs   int
	nextCall int
	// Follow, when set, delivers the lines a following Logs sends after the
	// stored ones.
	Follow chan function.LogLine
}

// NewBackend returns an empty Backend.
func NewBackend() *Backend {
	return &Backend{
		Fns:         map[string][]function.Version{},
		Records:     map[string]function.Call{},
		LogLines:    map[string][]function.LogLine{},
		seq:         map[string]int{},
		progs:       map[string]*program{},
		callOrder:   map[string]int{},
		logsChanged: make(chan struct{}),
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

func progKey(name string, version int) string { return name + "@" + strconv.Itoa(version) }

// Deploy does not check that code is a zip (callers' tests deploy any bytes);
// a zip holding a recognised module is "initialised" as the agent would.
func (f *Backend) Deploy(ctx context.Context, spec function.Spec, code []byte) (function.Version, error) {
	if err := f.fail(); err != nil {
		return function.Version{}, err
	}
	if err := spec.Normalize(); err != nil {
		return function.Version{}, err
	}
	if len(code) > function.MaxCodeZipBytes {
		return function.Version{}, errdefs.TooLarge(fmt.Sprintf("code package is %d bytes; the limit is %d bytes zipped", len(code), function.MaxCodeZipBytes))
	}
	prog, initErr := loadProgram(spec.Handler, code)
	if initErr != nil {
		// Worded as the dispatcher words a failed validation.
		return function.Version{}, errdefs.Invalid(fmt.Sprintf("deploy of %s rejected: the function failed to initialize: %s: %s\n%s",
			spec.Name, initErr.ErrorType, initErr.ErrorMessage, strings.Join(initErr.StackTrace, "")))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := max(f.seq[spec.Name], latest(f.Fns[spec.Name])) + 1
	f.seq[spec.Name] = n
	sum := sha256.Sum256(code)
	v := function.Version{
		Spec: spec, Version: n, CodeDigest: hex.EncodeToString(sum[:]),
		CodeSize: int64(len(code)), UID: 10000, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	f.Fns[spec.Name] = append(f.Fns[spec.Name], v)
	if prog != nil {
		f.progs[progKey(spec.Name, n)] = prog
	}
	return v, nil
}

// latest is the highest version number in vs (0 if none).
func latest(vs []function.Version) int {
	n := 0
	for _, v := range vs {
		n = max(n, v.Version)
	}
	return n
}

func (f *Backend) Function(ctx context.Context, name string, v int) (function.Version, error) {
	if err := f.fail(); err != nil {
		return function.Version{}, err
	}
	if err := function.ValidateName(name); err != nil {
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
	}
	for _, ver := range vs {
		if ver.Version == v {
			return ver, nil
		}
	}
	return function.Version{}, fmt.Errorf("function %q version %d: %w", name, v, errdefs.ErrNotFound)
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
	if err := function.ValidateName(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, ok := f.Fns[name]
	if !ok {
		return notFound(name)
	}
	f.seq[name] = max(f.seq[name], latest(vs))
	for _, v := range vs {
		delete(f.progs, progKey(name, v.Version))
	}
	delete(f.Fns, name)
	return nil
}

// run executes the fake handler and records a call. An async call of a
// recognised program is stored finished (it "ran" at once) but returned
// queued, as the real backend returns it; an async call of other code stays
// queued. A given call id is kept, and an async call whose id is already
// recorded is the retry of an accepted call: its record is returned and
// nothing runs again.
func (f *Backend) run(req function.InvokeRequest, mode string) (function.Call, function.InvokeResult, error) {
	if err := f.fail(); err != nil {
		return function.Call{}, function.InvokeResult{}, err
	}
	if len(req.Payload) > function.MaxPayloadBytes {
		return function.Call{}, function.InvokeResult{}, errdefs.TooLarge(fmt.Sprintf("payload of %d bytes exceeds the %d byte limit", len(req.Payload), function.MaxPayloadBytes))
	}
	v, err := f.Function(context.Background(), req.Function, req.Version)
	if err != nil {
		return function.Call{}, function.InvokeResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if prev, ok := f.Records[req.CallID]; ok && mode == "async" && req.CallID != "" {
		return prev, function.InvokeResult{}, nil
	}
	f.Invokes = append(f.Invokes, req)
	if mode == "async" {
		f.Asyncs++
	}
	f.nextCall++
	id := req.CallID
	if id == "" {
		id = "call-" + strconv.Itoa(f.nextCall)
	}
	res := function.InvokeResult{
		CallID: id, Version: v.Version, Start: function.StartWarm,
		StartTime: 1500 * time.Microsecond, Duration: 12 * time.Millisecond,
	}
	prog := f.progs[progKey(v.Name, v.Version)]
	if prog != nil {
		var printed []string
		res.Payload, res.Err, printed = prog.run(req.Payload)
		lines := f.callLog(v, id, res, printed)
		if req.LogTail {
			res.LogTail = logTail(lines)
		}
	} else {
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
	}
	call := function.Call{
		ID: res.CallID, Function: req.Function, Version: v.Version, Mode: mode,
		Status: function.StatusQueued, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	stored := call
	if mode == "sync" || prog != nil {
		stored.Status = function.StatusSucceeded
		stored.Result = res.Payload
		if res.Err != nil {
			stored.Status = function.StatusFailed
			stored.Result = nil
			stored.Error = res.Err
		}
	}
	if mode == "sync" {
		call = stored
	}
	f.Records[call.ID] = stored
	f.callOrder[call.ID] = f.nextCall
	return call, res, nil
}

// callLog appends a call's log lines, framed as the worker frames them,
// wakes followers, and returns the lines.
func (f *Backend) callLog(v function.Version, id string, res function.InvokeResult, printed []string) []function.LogLine {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	line := func(stream, text string) function.LogLine {
		return function.LogLine{Time: at, Function: v.Name, Version: v.Version, CallID: id, Stream: stream, Text: text}
	}
	lines := []function.LogLine{line("platform", fmt.Sprintf("START RequestId: %s Version: %d", id, v.Version))}
	for _, p := range printed {
		lines = append(lines, line("stdout", p))
	}
	if res.Err != nil {
		b, _ := json.Marshal(res.Err)
		lines = append(lines, line("platform", string(b)))
	}
	lines = append(lines, line("platform", "END RequestId: "+id),
		line("platform", fmt.Sprintf("REPORT RequestId: %s Duration: %.2f ms Memory Size: %d MB Start: %s (%.2f ms)",
			id, float64(res.Duration.Microseconds())/1000, v.MemoryMB, res.Start, float64(res.StartTime.Microseconds())/1000)))
	f.LogLines[v.Name] = append(f.LogLines[v.Name], lines...)
	close(f.logsChanged)
	f.logsChanged = make(chan struct{})
	return lines
}

// logTail is the last 4 KB of a call's log text, as the worker returns it.
func logTail(lines []function.LogLine) []byte {
	var sb strings.Builder
	for _, l := range lines {
		sb.WriteString(l.Text)
		sb.WriteByte('\n')
	}
	s := sb.String()
	if len(s) > 4096 {
		s = s[len(s)-4096:]
	}
	return []byte(s)
}

func (f *Backend) Invoke(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error) {
	_, res, err := f.run(req, "sync")
	return res, err
}

func (f *Backend) InvokeAsync(ctx context.Context, req function.InvokeRequest) (function.Call, error) {
	call, _, err := f.run(req, "async")
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

// Calls fails with ErrNotFound for a function that is not deployed (the
// gateway's tests rely on it; see RunBackendConformance for the real
// backend, which lists none). A limit of 0 or less lists every call.
func (f *Backend) Calls(ctx context.Context, name string, limit int) ([]function.Call, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	if err := function.ValidateName(name); err != nil {
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
	// Newest first: by the order the fake wrote them ("call-10" sorts
	// before "call-9" as a string), then by id for records a test added.
	sort.Slice(out, func(i, j int) bool {
		oi, oj := f.callOrder[out[i].ID], f.callOrder[out[j].ID]
		if oi != oj {
			return oi > oj
		}
		return out[i].ID > out[j].ID
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Logs sends the stored lines; following, it then sends the lines the fake
// appends and those a test sends on Follow, until ctx is done (which ends a
// follow normally: it returns nil).
func (f *Backend) Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error {
	if err := f.fail(); err != nil {
		return err
	}
	if err := function.ValidateName(name); err != nil {
		return err
	}
	f.mu.Lock()
	_, deployed := f.Fns[name]
	lines := append([]function.LogLine(nil), f.LogLines[name]...)
	ch := f.Follow
	changed := f.logsChanged
	f.mu.Unlock()
	if !deployed && !follow {
		return notFound(name)
	}
	for _, l := range lines {
		if err := fn(l); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	sent := len(lines)
	for {
		select {
		case <-ctx.Done():
			return nil
		case l := <-ch:
			if err := fn(l); err != nil {
				return err
			}
		case <-changed:
			f.mu.Lock()
			all := f.LogLines[name]
			var more []function.LogLine
			if len(all) > sent {
				more = append(more, all[sent:]...)
				sent = len(all)
			}
			changed = f.logsChanged
			f.mu.Unlock()
			for _, l := range more {
				if err := fn(l); err != nil {
					return err
				}
			}
		}
	}
}
