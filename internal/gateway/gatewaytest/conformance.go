package gatewaytest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// backendAPI is gateway.Backend's method set. The suite cannot name
// gateway.Backend: the gateway's own tests import this package, so this
// package must not import the gateway. This package's tests check that the
// two method sets stay identical.
type backendAPI interface {
	Deploy(ctx context.Context, spec function.Spec, codeZip []byte) (function.Version, error)
	Function(ctx context.Context, name string, v int) (function.Version, error)
	Functions(ctx context.Context) ([]function.Version, error)
	DeleteFunction(ctx context.Context, name string) error
	Invoke(ctx context.Context, req function.InvokeRequest) (function.InvokeResult, error)
	InvokeAsync(ctx context.Context, req function.InvokeRequest) (function.Call, error)
	Call(ctx context.Context, id string) (function.Call, error)
	Calls(ctx context.Context, name string, limit int) ([]function.Call, error)
	Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error
}

// settle bounds the wait for what a backend may do after answering: write
// a sync call's record, run an async call, publish log lines. It covers a
// cold start in a sandbox on a slow CI machine.
const settle = 20 * time.Second

// RunBackendConformance is the contract of gateway.Backend (its doc
// comments), run against a backend: every implementation passes it — the
// real dispatcher with its workers, and this package's fake. newBackend
// returns a fresh, empty backend for each subtest, cleaned up with t; call it
// as RunBackendConformance(t, func(t *testing.T) gateway.Backend { ... }).
//
// The suite deploys only EchoSource, RaiseSource and SyntaxErrorSource as
// app.py, which the fake recognises, so the same code means the same thing
// to both. It tolerates what the contract leaves open (call ids, start
// paths, timings, JSON spacing, platform log lines) and nothing else.
func RunBackendConformance[B backendAPI](t *testing.T, newBackend func(t *testing.T) B) {
	t.Run("Deploy", func(t *testing.T) { testDeploy(t, newBackend(t)) })
	t.Run("DeployInvalidSpec", func(t *testing.T) { testDeployInvalidSpec(t, newBackend(t)) })
	t.Run("DeployInitFailure", func(t *testing.T) { testDeployInitFailure(t, newBackend(t)) })
	t.Run("Functions", func(t *testing.T) { testFunctions(t, newBackend(t)) })
	t.Run("DeleteFunction", func(t *testing.T) { testDeleteFunction(t, newBackend(t)) })
	t.Run("Invoke", func(t *testing.T) { testInvoke(t, newBackend(t)) })
	t.Run("InvokeRejects", func(t *testing.T) { testInvokeRejects(t, newBackend(t)) })
	t.Run("InvokeAsync", func(t *testing.T) { testInvokeAsync(t, newBackend(t)) })
	t.Run("Call", func(t *testing.T) { testCall(t, newBackend(t)) })
	t.Run("Calls", func(t *testing.T) { testCalls(t, newBackend(t)) })
	t.Run("Logs", func(t *testing.T) { testLogs(t, newBackend(t)) })
	t.Run("LogsFollow", func(t *testing.T) { testLogsFollow(t, newBackend(t)) })
}

// CodeZip returns a code package holding src as app.py (handler app.NAME).
func CodeZip(t testing.TB, src string) []byte {
	t.Helper()
	b, err := codezip.FromFiles(map[string]string{"app.py": src})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deploy deploys src as name with handler app.handler.
func deploy(t *testing.T, b backendAPI, name, src string) function.Version {
	t.Helper()
	v, err := b.Deploy(testenv.Ctx(t), function.Spec{Name: name, Handler: "app.handler"}, CodeZip(t, src))
	if err != nil {
		t.Fatalf("Deploy %s: %v", name, err)
	}
	return v
}

// sameJSON reports whether a and b are the same JSON value (spacing and key
// order aside: Python's json.dumps writes {"a": 1}).
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s = %v, want %v", what, err, class)
	}
}

var starts = map[string]bool{function.StartHot: true, function.StartWarm: true, function.StartCold: true, function.StartRestore: true}

func testDeploy(t *testing.T, b backendAPI) {
	ctx := testenv.Ctx(t)
	code := CodeZip(t, EchoSource)
	sum := sha256.Sum256(code)
	v1, err := b.Deploy(ctx, function.Spec{Name: "greet", Handler: "app.handler", Env: map[string]string{"A": "1"}}, code)
	if err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	if v1.Name != "greet" || v1.Version != 1 || v1.Handler != "app.handler" || v1.Runtime != "python3" ||
		v1.MemoryMB != function.DefaultMemoryMB || v1.Timeout() != function.DefaultTimeout || v1.Env["A"] != "1" ||
		v1.CodeSize != int64(len(code)) || v1.CodeDigest != hex.EncodeToString(sum[:]) || v1.UID <= 0 || v1.CreatedAt.IsZero() {
		t.Errorf("Deploy = %+v, want version 1 with defaults filled, the code's size and sha256, a uid and a time", v1)
	}
	v2, err := b.Deploy(ctx, function.Spec{Name: "greet", Handler: "app.handler", MemoryMB: 256}, CodeZip(t, RaiseSource))
	if err != nil {
		t.Fatalf("redeploy: %v", err)
	}
	if v2.Version != 2 || v2.MemoryMB != 256 || v2.UID != v1.UID || v2.CodeDigest == v1.CodeDigest {
		t.Errorf("redeploy = %+v, want version 2 with the same uid (%d) and the new code", v2, v1.UID)
	}

	tests := []struct {
		name    string
		fn      string
		version int
		want    int   // version expected
		class   error // or the error class
	}{
		{"latest", "greet", 0, 2, nil},
		{"pinned old", "greet", 1, 1, nil},
		{"pinned latest", "greet", 2, 2, nil},
		{"missing version", "greet", 3, 0, errdefs.ErrNotFound},
		{"unknown function", "ghost", 0, 0, errdefs.ErrNotFound},
		{"unknown function pinned", "ghost", 1, 0, errdefs.ErrNotFound},
		{"invalid name", "a b", 0, 0, errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := b.Function(testenv.Ctx(t), tt.fn, tt.version)
			if tt.class != nil {
				wantClass(t, "Function", err, tt.class)
				return
			}
			if err != nil || got.Version != tt.want || got.Name != tt.fn {
				t.Fatalf("Function(%s, %d) = %+v, %v; want version %d", tt.fn, tt.version, got, err, tt.want)
			}
			want := map[int]function.Version{1: v1, 2: v2}[tt.want]
			if got.CodeDigest != want.CodeDigest || got.MemoryMB != want.MemoryMB || got.UID != want.UID {
				t.Errorf("Function(%s, %d) = %+v, want %+v", tt.fn, tt.version, got, want)
			}
		})
	}

	t.Run("code too large", func(t *testing.T) {
		_, err := b.Deploy(testenv.Ctx(t), function.Spec{Name: "big", Handler: "app.handler"}, make([]byte, function.MaxCodeZipBytes+1))
		wantClass(t, "Deploy of an oversized package", err, errdefs.ErrTooLarge)
	})
}

func testDeployInvalidSpec(t *testing.T, b backendAPI) {
	code := CodeZip(t, EchoSource)
	tests := []struct {
		name string
		spec function.Spec
		text string
	}{
		{"no name", function.Spec{Handler: "app.handler"}, "function name"},
		{"bad name", function.Spec{Name: "a.b", Handler: "app.handler"}, "function name"},
		{"bad handler", function.Spec{Name: "f", Handler: "nodot"}, "handler"},
		{"bad runtime", function.Spec{Name: "f", Handler: "app.handler", Runtime: "cobol"}, "runtime"},
		{"memory too small", function.Spec{Name: "f", Handler: "app.handler", MemoryMB: 1}, "memory"},
		{"timeout too long", function.Spec{Name: "f", Handler: "app.handler", TimeoutSec: 10000}, "timeout"},
		{"negative concurrency", function.Spec{Name: "f", Handler: "app.handler", Concurrency: -1}, "concurrency"},
		{"reserved env", function.Spec{Name: "f", Handler: "app.handler", Env: map[string]string{"TORPOR_X": "1"}}, "reserved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Deploy(testenv.Ctx(t), tt.spec, code)
			wantClass(t, "Deploy", err, errdefs.ErrInvalid)
			if err != nil && !strings.Contains(err.Error(), tt.text) {
				t.Errorf("error %q does not mention %q", err, tt.text)
			}
		})
	}
	if fns, err := b.Functions(testenv.Ctx(t)); err != nil || len(fns) != 0 {
		t.Errorf("after rejected deploys Functions = %+v, %v; want none", fns, err)
	}
}

func testDeployInitFailure(t *testing.T, b backendAPI) {
	tests := []struct {
		name    string
		handler string
		src     string
		want    []string // in the error message: the runtime's own error
	}{
		{"syntax error", "app.handler", SyntaxErrorSource, []string{"Runtime.UserCodeSyntaxError", "Syntax error in module 'app'", "line 1"}},
		{"missing handler", "app.missing", EchoSource, []string{"Runtime.HandlerNotFound", "Handler 'missing' missing on module 'app'"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testenv.Ctx(t)
			name := "broken" + string(rune('a'+i))
			_, err := b.Deploy(ctx, function.Spec{Name: name, Handler: tt.handler}, CodeZip(t, tt.src))
			wantClass(t, "Deploy", err, errdefs.ErrInvalid)
			if err == nil {
				return
			}
			for _, w := range append([]string{name}, tt.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// Nothing was stored, and the version counter did not move.
			_, err = b.Function(ctx, name, 0)
			wantClass(t, "Function after a rejected deploy", err, errdefs.ErrNotFound)
			if v := deploy(t, b, name, EchoSource); v.Version != 1 {
				t.Errorf("the first good deploy after a rejected one is version %d, want 1", v.Version)
			}
		})
	}
}

func testFunctions(t *testing.T, b backendAPI) {
	ctx := testenv.Ctx(t)
	if fns, err := b.Functions(ctx); err != nil || len(fns) != 0 {
		t.Errorf("Functions of an empty backend = %+v, %v", fns, err)
	}
	deploy(t, b, "beta", EchoSource)
	deploy(t, b, "alpha", EchoSource)
	deploy(t, b, "alpha", RaiseSource)
	fns, err := b.Functions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range fns {
		got[f.Name] = f.Version
	}
	if len(fns) != 2 || got["alpha"] != 2 || got["beta"] != 1 {
		t.Errorf("Functions = %+v, want the latest version of each: alpha 2, beta 1", fns)
	}
}

func testDeleteFunction(t *testing.T, b backendAPI) {
	ctx := testenv.Ctx(t)
	deploy(t, b, "doomed", EchoSource)
	deploy(t, b, "doomed", EchoSource)
	deploy(t, b, "kept", EchoSource)
	if err := b.DeleteFunction(ctx, "doomed"); err != nil {
		t.Fatalf("DeleteFunction: %v", err)
	}
	for _, v := range []int{0, 1, 2} {
		_, err := b.Function(ctx, "doomed", v)
		wantClass(t, "Function of a deleted function", err, errdefs.ErrNotFound)
	}
	fns, err := b.Functions(ctx)
	if err != nil || len(fns) != 1 || fns[0].Name != "kept" {
		t.Errorf("Functions after the delete = %+v, %v; want only kept", fns, err)
	}
	_, err = b.Invoke(ctx, function.InvokeRequest{Function: "doomed", Payload: []byte(`{}`)})
	wantClass(t, "Invoke of a deleted function", err, errdefs.ErrNotFound)
	wantClass(t, "DeleteFunction again", b.DeleteFunction(ctx, "doomed"), errdefs.ErrNotFound)
	wantClass(t, "DeleteFunction of an unknown function", b.DeleteFunction(ctx, "ghost"), errdefs.ErrNotFound)
	wantClass(t, "DeleteFunction of an invalid name", b.DeleteFunction(ctx, "bad/name"), errdefs.ErrInvalid)
	// Version numbers are never reused, even after a delete
	// (docs/architecture.md).
	if v := deploy(t, b, "doomed", EchoSource); v.Version != 3 {
		t.Errorf("redeploy after delete = version %d, want 3", v.Version)
	}
	if _, err := b.Function(ctx, "kept", 0); err != nil {
		t.Errorf("the other function went too: %v", err)
	}
}

func testInvoke(t *testing.T, b backendAPI) {
	deploy(t, b, "fn", RaiseSource) // v1
	deploy(t, b, "fn", EchoSource)  // v2, latest
	tests := []struct {
		name    string
		req     function.InvokeRequest
		version int
		errType string // "" for a result
	}{
		{"latest returns the event", function.InvokeRequest{Function: "fn", Payload: []byte(`{"n": 1, "s": "x"}`)}, 2, ""},
		{"pinned version", function.InvokeRequest{Function: "fn", Version: 2, Payload: []byte(`[1,2]`)}, 2, ""},
		{"scalar event", function.InvokeRequest{Function: "fn", Payload: []byte(`"hi"`)}, 2, ""},
		{"function error is a result", function.InvokeRequest{Function: "fn", Version: 1, Payload: []byte(`{}`)}, 1, "ValueError"},
		{"given call id", function.InvokeRequest{Function: "fn", CallID: function.NewCallID(), Payload: []byte(`{}`)}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := b.Invoke(testenv.Ctx(t), tt.req)
			if err != nil {
				t.Fatalf("Invoke = %v; a call that ran is a result, even when the handler raised", err)
			}
			if res.CallID == "" || (tt.req.CallID != "" && res.CallID != tt.req.CallID) {
				t.Errorf("CallID = %q, want one assigned (or the given %q)", res.CallID, tt.req.CallID)
			}
			if res.Version != tt.version || !starts[res.Start] || res.StartTime < 0 || res.Duration < 0 {
				t.Errorf("result = %+v, want version %d and a known start path", res, tt.version)
			}
			if tt.errType == "" {
				if res.Err != nil || !sameJSON(res.Payload, tt.req.Payload) {
					t.Errorf("result = %s (err %v), want the event %s back", res.Payload, res.Err, tt.req.Payload)
				}
				return
			}
			if res.Err == nil || res.Err.ErrorType != tt.errType || res.Err.ErrorMessage != "boom" {
				t.Errorf("Err = %+v, want %s: boom", res.Err, tt.errType)
			}
		})
	}
	t.Run("log tail", func(t *testing.T) {
		res, err := b.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "fn", Payload: []byte(`{}`), LogTail: true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(res.LogTail), LogMarker) {
			t.Errorf("LogTail = %q, want what the call printed (%q)", res.LogTail, LogMarker)
		}
	})
}

// testInvokeRejects: what cannot run is a Go error of the right class, from
// Invoke and InvokeAsync alike, and InvokeAsync accepts nothing it rejects.
func testInvokeRejects(t *testing.T, b backendAPI) {
	deploy(t, b, "fn", EchoSource)
	tests := []struct {
		name  string
		req   function.InvokeRequest
		class error
	}{
		{"unknown function", function.InvokeRequest{Function: "ghost", Payload: []byte(`{}`)}, errdefs.ErrNotFound},
		{"unknown version", function.InvokeRequest{Function: "fn", Version: 9, Payload: []byte(`{}`)}, errdefs.ErrNotFound},
		{"invalid name", function.InvokeRequest{Function: "a>b", Payload: []byte(`{}`)}, errdefs.ErrInvalid},
		{"payload too large", function.InvokeRequest{Function: "fn", Payload: make([]byte, function.MaxPayloadBytes+1)}, errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testenv.Ctx(t)
			_, err := b.Invoke(ctx, tt.req)
			wantClass(t, "Invoke", err, tt.class)
			_, err = b.InvokeAsync(ctx, tt.req)
			wantClass(t, "InvokeAsync", err, tt.class)
		})
	}
	if calls, err := b.Calls(testenv.Ctx(t), "fn", 10); err != nil || len(calls) != 0 {
		t.Errorf("after rejected calls Calls lists %d calls (%v); want none", len(calls), err)
	}
}

// waitCall polls Call until the call has finished.
func waitCall(t *testing.T, b backendAPI, id string) function.Call {
	t.Helper()
	var c function.Call
	testenv.Eventually(t, settle, "call "+id+" to finish", func() bool {
		var err error
		c, err = b.Call(testenv.Ctx(t), id)
		return err == nil && (c.Status == function.StatusSucceeded || c.Status == function.StatusFailed)
	})
	return c
}

func testInvokeAsync(t *testing.T, b backendAPI) {
	deploy(t, b, "job", RaiseSource) // v1
	deploy(t, b, "job", EchoSource)  // v2, latest
	tests := []struct {
		name    string
		req     function.InvokeRequest
		version int
		status  string
	}{
		{"succeeds with the result", function.InvokeRequest{Function: "job", Payload: []byte(`{"k": "v"}`)}, 2, function.StatusSucceeded},
		{"pinned version fails with the error", function.InvokeRequest{Function: "job", Version: 1, Payload: []byte(`{}`)}, 1, function.StatusFailed},
		{"given call id", function.InvokeRequest{Function: "job", CallID: function.NewCallID(), Payload: []byte(`1`)}, 2, function.StatusSucceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := b.InvokeAsync(testenv.Ctx(t), tt.req)
			if err != nil {
				t.Fatalf("InvokeAsync: %v", err)
			}
			if c.ID == "" || (tt.req.CallID != "" && c.ID != tt.req.CallID) || c.Function != "job" || c.Version != tt.version ||
				c.Mode != "async" || c.Status != function.StatusQueued || c.CreatedAt.IsZero() {
				t.Errorf("InvokeAsync = %+v, want a queued async record of version %d", c, tt.version)
			}
			done := waitCall(t, b, c.ID)
			if done.Status != tt.status || done.Mode != "async" || done.Function != "job" || done.Version != tt.version {
				t.Errorf("finished call = %+v, want %s", done, tt.status)
			}
			if tt.status == function.StatusSucceeded && (!sameJSON(done.Result, tt.req.Payload) || done.Error != nil) {
				t.Errorf("Result = %s (error %+v), want the event %s", done.Result, done.Error, tt.req.Payload)
			}
			if tt.status == function.StatusFailed && (done.Error == nil || done.Error.ErrorType != "ValueError" || done.Error.ErrorMessage != "boom") {
				t.Errorf("Error = %+v, want ValueError: boom", done.Error)
			}
		})
	}
	// A client retrying an accepted call (same id) gets that call back; its
	// outcome is kept and it is not run again.
	t.Run("retry with the same id", func(t *testing.T) {
		ctx := testenv.Ctx(t)
		id := function.NewCallID()
		if _, err := b.InvokeAsync(ctx, function.InvokeRequest{Function: "job", CallID: id, Payload: []byte(`{"try": 1}`)}); err != nil {
			t.Fatal(err)
		}
		waitCall(t, b, id)
		again, err := b.InvokeAsync(ctx, function.InvokeRequest{Function: "job", CallID: id, Payload: []byte(`{"try": 1}`)})
		if err != nil || again.ID != id {
			t.Fatalf("retried InvokeAsync = %+v, %v; want call %s", again, err, id)
		}
		c, err := b.Call(ctx, id)
		if err != nil || c.Status != function.StatusSucceeded || !sameJSON(c.Result, []byte(`{"try": 1}`)) {
			t.Errorf("after the retry Call = %+v, %v; want the first run's outcome kept", c, err)
		}
		calls, err := b.Calls(ctx, "job", 100)
		n := 0
		for _, c := range calls {
			if c.ID == id {
				n++
			}
		}
		if err != nil || n != 1 {
			t.Errorf("Calls lists call %s %d times (%v), want once", id, n, err)
		}
	})
}

func testCall(t *testing.T, b backendAPI) {
	deploy(t, b, "fn", RaiseSource) // v1
	deploy(t, b, "fn", EchoSource)  // v2
	ctx := testenv.Ctx(t)
	ok, err := b.Invoke(ctx, function.InvokeRequest{Function: "fn", Payload: []byte(`{"a": [1]}`)})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := b.Invoke(ctx, function.InvokeRequest{Function: "fn", Version: 1, Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	// A sync call is recorded too (perhaps just after it answered).
	c := waitCall(t, b, ok.CallID)
	if c.ID != ok.CallID || c.Function != "fn" || c.Version != 2 || c.Mode != "sync" || c.Status != function.StatusSucceeded ||
		!sameJSON(c.Result, []byte(`{"a": [1]}`)) || c.Error != nil {
		t.Errorf("record of a sync call = %+v (result %s)", c, c.Result)
	}
	c = waitCall(t, b, bad.CallID)
	if c.Version != 1 || c.Mode != "sync" || c.Status != function.StatusFailed || c.Error == nil || c.Error.ErrorType != "ValueError" {
		t.Errorf("record of a failed sync call = %+v", c)
	}
	_, err = b.Call(ctx, function.NewCallID())
	wantClass(t, "Call of an unknown id", err, errdefs.ErrNotFound)
}

func testCalls(t *testing.T, b backendAPI) {
	deploy(t, b, "fn", EchoSource)
	deploy(t, b, "quiet", EchoSource)
	ctx := testenv.Ctx(t)
	var ids []string // oldest first
	for i := 0; i < 3; i++ {
		res, err := b.Invoke(ctx, function.InvokeRequest{Function: "fn", Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.CallID)
	}
	c, err := b.InvokeAsync(ctx, function.InvokeRequest{Function: "fn", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, c.ID)
	for _, id := range ids {
		waitCall(t, b, id)
	}
	listed := func(limit int) []string {
		t.Helper()
		calls, err := b.Calls(ctx, "fn", limit)
		if err != nil {
			t.Fatalf("Calls(fn, %d): %v", limit, err)
		}
		var out []string
		for _, c := range calls {
			if c.Function != "fn" {
				t.Errorf("Calls(fn) lists a call of %s", c.Function)
			}
			out = append(out, c.ID)
		}
		return out
	}
	newest := []string{ids[3], ids[2], ids[1], ids[0]}
	tests := []struct {
		limit int
		want  []string
	}{{10, newest}, {4, newest}, {2, newest[:2]}, {1, newest[:1]}}
	for _, tt := range tests {
		if got := listed(tt.limit); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Calls(fn, %d) = %v, want %v (newest first)", tt.limit, got, tt.want)
		}
	}
	if calls, err := b.Calls(ctx, "quiet", 10); err != nil || len(calls) != 0 {
		t.Errorf("Calls of a function never called = %+v, %v; want none", calls, err)
	}
	_, err = b.Calls(ctx, "ghost", 10)
	wantClass(t, "Calls of an unknown function", err, errdefs.ErrNotFound)
	_, err = b.Calls(ctx, "a b", 10)
	wantClass(t, "Calls of an invalid name", err, errdefs.ErrInvalid)
}

// logsOf collects the lines Logs sends without following.
func logsOf(t *testing.T, b backendAPI, name string) []function.LogLine {
	t.Helper()
	var lines []function.LogLine
	if err := b.Logs(testenv.Ctx(t), name, false, func(l function.LogLine) error {
		lines = append(lines, l)
		return nil
	}); err != nil {
		t.Fatalf("Logs(%s): %v", name, err)
	}
	return lines
}

// printed reports whether lines hold the marker line call id printed.
func printed(lines []function.LogLine, name string, version int, id string) bool {
	for _, l := range lines {
		if l.CallID == id && l.Text == LogMarker && l.Stream == "stdout" && l.Function == name && l.Version == version {
			return true
		}
	}
	return false
}

func testLogs(t *testing.T, b backendAPI) {
	deploy(t, b, "chatty", EchoSource)
	deploy(t, b, "other", EchoSource)
	deploy(t, b, "quiet", EchoSource)
	ctx := testenv.Ctx(t)

	start := time.Now()
	if lines := logsOf(t, b, "quiet"); len(lines) != 0 {
		t.Errorf("Logs of a function never called = %+v, want none", lines)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Logs of a function without logs took %s to return", d)
	}

	var ids []string
	for _, req := range []function.InvokeRequest{{Function: "chatty", Payload: []byte(`{}`)}, {Function: "other", Payload: []byte(`{}`)}} {
		res, err := b.Invoke(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.CallID)
	}
	c, err := b.InvokeAsync(ctx, function.InvokeRequest{Function: "chatty", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var lines []function.LogLine
	testenv.Eventually(t, settle, "the lines both calls of chatty printed", func() bool {
		lines = logsOf(t, b, "chatty")
		return printed(lines, "chatty", 1, ids[0]) && printed(lines, "chatty", 1, c.ID)
	})
	for _, l := range lines {
		if l.Function != "chatty" || l.CallID == ids[1] {
			t.Errorf("Logs(chatty) sent a line of another function: %+v", l)
		}
	}
	testenv.Eventually(t, settle, "the line other printed", func() bool { return printed(logsOf(t, b, "other"), "other", 1, ids[1]) })

	t.Run("callback error stops", func(t *testing.T) {
		stop := errors.New("stop")
		n := 0
		err := b.Logs(testenv.Ctx(t), "chatty", false, func(function.LogLine) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Errorf("Logs = %v after %d lines, want the callback's error after 1", err, n)
		}
	})
	t.Run("unknown function", func(t *testing.T) {
		err := b.Logs(testenv.Ctx(t), "ghost", false, func(function.LogLine) error { return nil })
		wantClass(t, "Logs(ghost)", err, errdefs.ErrNotFound)
	})
	t.Run("invalid name", func(t *testing.T) {
		for _, follow := range []bool{false, true} {
			err := b.Logs(testenv.Ctx(t), "a>b", follow, func(function.LogLine) error { return nil })
			wantClass(t, "Logs(a>b)", err, errdefs.ErrInvalid)
		}
	})
}

func testLogsFollow(t *testing.T, b backendAPI) {
	deploy(t, b, "fn", EchoSource)
	ctx := testenv.Ctx(t)
	first, err := b.Invoke(ctx, function.InvokeRequest{Function: "fn", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu  sync.Mutex
		got []function.LogLine
	)
	done := make(chan error, 1)
	go func() {
		done <- b.Logs(fctx, "fn", true, func(l function.LogLine) error {
			mu.Lock()
			got = append(got, l)
			mu.Unlock()
			return nil
		})
	}()
	seen := func(id string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return printed(got, "fn", 1, id)
		}
	}
	testenv.Eventually(t, settle, "the line of the call made before following", seen(first.CallID))
	later, err := b.Invoke(ctx, function.InvokeRequest{Function: "fn", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, settle, "the line of a call made while following", seen(later.CallID))
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Logs(follow) after its context ended = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Logs(follow) did not return after its context ended")
	}
}
