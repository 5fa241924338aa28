package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// testServer runs a gateway over a fresh fake backend.
type testServer struct {
	*httptest.Server
	b   *gatewaytest.Backend
	reg *prometheus.Registry
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	b := gatewaytest.NewBackend()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts := httptest.NewServer(New(b, Options{Log: log, Registry: reg}))
	t.Cleanup(ts.Close)
	return &testServer{Server: ts, b: b, reg: reg}
}

// testWriter sends log output to t.Log so it shows only for failing tests.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// response is a fully read HTTP response.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) apiError(t *testing.T) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q is not the /v1 error JSON: %v", r.body, err)
	}
	return e
}

func (ts *testServer) do(t *testing.T, method, path string, body []byte, hdr ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func deployBody(t *testing.T, spec function.Spec, code []byte) []byte {
	t.Helper()
	b, err := json.Marshal(api.DeployRequest{Spec: spec, CodeZip: code})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deploy deploys a function "name" through the API.
func (ts *testServer) deploy(t *testing.T, name string) {
	t.Helper()
	r := ts.do(t, "PUT", "/v1/functions/"+name, deployBody(t, function.Spec{Handler: "app.handler"}, []byte("PK-zip")))
	if r.status != http.StatusCreated && r.status != http.StatusOK {
		t.Fatalf("deploy %s: %d %s", name, r.status, r.body)
	}
}

// wantError checks a /v1 error response.
func wantError(t *testing.T, r response, status int, code, msgPart string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	e := r.apiError(t)
	if e.Code != code {
		t.Errorf("code %q, want %q (message %q)", e.Code, code, e.Message)
	}
	if !strings.Contains(e.Message, msgPart) {
		t.Errorf("message %q does not contain %q", e.Message, msgPart)
	}
}

func TestDeployAndFunctions(t *testing.T) {
	ts := newTestServer(t)
	spec := function.Spec{Runtime: "python3", Handler: "app.handler", MemoryMB: 256, TimeoutSec: 5, Env: map[string]string{"A": "1"}, Concurrency: 4}
	code := []byte("PK\x03\x04 not really a zip")

	// First deploy creates the function.
	r := ts.do(t, "PUT", "/v1/functions/hello", deployBody(t, spec, code))
	if r.status != http.StatusCreated {
		t.Fatalf("first deploy: %d %s", r.status, r.body)
	}
	if loc := r.header.Get("Location"); loc != "/v1/functions/hello" {
		t.Errorf("Location %q", loc)
	}
	var v function.Version
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	if v.Name != "hello" || v.Version != 1 || v.MemoryMB != 256 || v.Env["A"] != "1" || v.Concurrency != 4 || v.CodeSize != int64(len(code)) {
		t.Errorf("version %+v", v)
	}
	if bytes.Contains(r.body, []byte("code_zip")) {
		t.Errorf("the version JSON carries the code: %s", r.body)
	}
	// The exact wire shape of Version.
	var shape map[string]any
	_ = json.Unmarshal(r.body, &shape)
	for _, k := range []string{"name", "runtime", "handler", "memory_mb", "timeout_s", "env", "concurrency", "version", "code_sha256", "code_size", "uid", "created_at"} {
		if _, ok := shape[k]; !ok {
			t.Errorf("version JSON lacks %q: %s", k, r.body)
		}
	}

	// A second deploy is a new version of an existing function.
	if r := ts.do(t, "PUT", "/v1/functions/hello", deployBody(t, function.Spec{Handler: "app.other"}, code)); r.status != http.StatusOK {
		t.Fatalf("second deploy: %d %s", r.status, r.body)
	}
	ts.deploy(t, "zeta")

	tests := []struct {
		name, method, path string
		status             int
		check              func(t *testing.T, r response)
	}{
		{"get latest", "GET", "/v1/functions/hello", 200, func(t *testing.T, r response) {
			var v function.Version
			_ = json.Unmarshal(r.body, &v)
			if v.Version != 2 || v.Handler != "app.other" {
				t.Errorf("got %+v", v)
			}
		}},
		{"get version 1", "GET", "/v1/functions/hello?version=1", 200, func(t *testing.T, r response) {
			var v function.Version
			_ = json.Unmarshal(r.body, &v)
			if v.Version != 1 || v.Handler != "app.handler" {
				t.Errorf("got %+v", v)
			}
		}},
		{"list", "GET", "/v1/functions", 200, func(t *testing.T, r response) {
			var l api.FunctionList
			if err := json.Unmarshal(r.body, &l); err != nil {
				t.Fatal(err)
			}
			if len(l.Functions) != 2 || l.Functions[0].Name != "hello" || l.Functions[0].Version != 2 || l.Functions[1].Name != "zeta" {
				t.Errorf("got %s", r.body)
			}
		}},
		{"get missing version", "GET", "/v1/functions/hello?version=9", 404, func(t *testing.T, r response) {
			wantError(t, r, 404, api.CodeNotFound, "version 9")
		}},
		{"get bad version", "GET", "/v1/functions/hello?version=x", 400, func(t *testing.T, r response) {
			wantError(t, r, 400, api.CodeInvalid, `invalid version "x"`)
		}},
		{"get zero version", "GET", "/v1/functions/hello?version=0", 400, nil},
		{"get unknown", "GET", "/v1/functions/nope", 404, func(t *testing.T, r response) {
			wantError(t, r, 404, api.CodeNotFound, `"nope"`)
		}},
		{"get bad name", "GET", "/v1/functions/b%40d", 400, func(t *testing.T, r response) {
			wantError(t, r, 400, api.CodeInvalid, "[A-Za-z0-9_-]")
		}},
		{"delete", "DELETE", "/v1/functions/zeta", 204, func(t *testing.T, r response) {
			if len(r.body) != 0 {
				t.Errorf("body %q", r.body)
			}
		}},
		{"deleted is gone", "GET", "/v1/functions/zeta", 404, nil},
		{"delete unknown", "DELETE", "/v1/functions/zeta", 404, func(t *testing.T, r response) {
			wantError(t, r, 404, api.CodeNotFound, "zeta")
		}},
		{"delete bad name", "DELETE", "/v1/functions/" + strings.Repeat("a", 65), 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ts.do(t, tc.method, tc.path, nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestListFunctionsEmpty(t *testing.T) {
	ts := newTestServer(t)
	r := ts.do(t, "GET", "/v1/functions", nil)
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"functions":[]}` {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestDeployBadInput(t *testing.T) {
	ts := newTestServer(t)
	valid := function.Spec{Handler: "app.handler"}
	code := []byte("zip")
	tests := []struct {
		name    string
		path    string
		body    []byte
		status  int
		code    string
		msgPart string
	}{
		{"bad name", "/v1/functions/has.dot", deployBody(t, valid, code), 400, api.CodeInvalid, "use 1-64 characters from [A-Za-z0-9_-]"},
		{"name too long", "/v1/functions/" + strings.Repeat("x", 65), deployBody(t, valid, code), 400, api.CodeInvalid, "1-64"},
		{"malformed JSON", "/v1/functions/f", []byte(`{"handler":`), 400, api.CodeInvalid, "invalid deploy request"},
		{"unknown field", "/v1/functions/f", []byte(`{"handler":"app.handler","memory":256,"code_zip":"emlw"}`), 400, api.CodeInvalid, `unknown field "memory"`},
		{"trailing data", "/v1/functions/f", []byte(`{"handler":"app.handler","code_zip":"emlw"} {}`), 400, api.CodeInvalid, "after the JSON object"},
		{"bad base64", "/v1/functions/f", []byte(`{"handler":"app.handler","code_zip":"!!!"}`), 400, api.CodeInvalid, "base64"},
		{"no code", "/v1/functions/f", []byte(`{"handler":"app.handler"}`), 400, api.CodeInvalid, "code_zip is missing"},
		{"bad handler", "/v1/functions/f", deployBody(t, function.Spec{Handler: "nodot"}, code), 400, api.CodeInvalid, "MODULE.FUNCTION"},
		{"bad runtime", "/v1/functions/f", deployBody(t, function.Spec{Handler: "app.h", Runtime: "cobol"}, code), 400, api.CodeInvalid, "unsupported runtime"},
		{"memory out of range", "/v1/functions/f", deployBody(t, function.Spec{Handler: "app.h", MemoryMB: 1}, code), 400, api.CodeInvalid, "memory 1 MB"},
		{"timeout out of range", "/v1/functions/f", deployBody(t, function.Spec{Handler: "app.h", TimeoutSec: 10000}, code), 400, api.CodeInvalid, "timeout"},
		{"reserved env", "/v1/functions/f", deployBody(t, function.Spec{Handler: "app.h", Env: map[string]string{"TORPOR_X": "1"}}, code), 400, api.CodeInvalid, "reserved"},
		{"name mismatch", "/v1/functions/f", deployBody(t, function.Spec{Name: "g", Handler: "app.h"}, code), 400, api.CodeInvalid, `names function "g"`},
		{"body too large", "/v1/functions/f", bytes.Repeat([]byte(" "), maxDeployBody+1), 413, api.CodeTooLarge, "50 MB"},
		{"zip too large", "/v1/functions/f", deployBody(t, valid, make([]byte, function.MaxCodeZipBytes+1)), 413, api.CodeTooLarge, "50 MB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, ts.do(t, "PUT", tc.path, tc.body), tc.status, tc.code, tc.msgPart)
		})
	}
	if n := len(ts.b.Fns); n != 0 {
		t.Errorf("%d functions reached the backend", n)
	}
}

func TestInvokeV1(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	ts.deploy(t, "echo") // version 2

	tests := []struct {
		name        string
		path        string
		body        string
		status      int
		wantBody    string // exact, when set
		wantVersion int    // forwarded to the backend
		wantPayload string // forwarded to the backend
		fnError     bool
	}{
		{"sync", "/v1/functions/echo/invoke", `{"a":1}`, 200, `{"echo":{"a":1}}`, 0, `{"a":1}`, false},
		{"empty event is {}", "/v1/functions/echo/invoke", ``, 200, `{"echo":{}}`, 0, `{}`, false},
		{"scalar event", "/v1/functions/echo/invoke", `42`, 200, `{"echo":42}`, 0, `42`, false},
		{"version", "/v1/functions/echo/invoke?version=1", `"x"`, 200, `{"echo":"x"}`, 1, `"x"`, false},
		{"async=false is sync", "/v1/functions/echo/invoke?async=false", `{}`, 200, `{"echo":{}}`, 0, `{}`, false},
		{"handler error", "/v1/functions/echo/invoke", `{"raise":"ValueError"}`, 200, "", 0, `{"raise":"ValueError"}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ts.do(t, "POST", tc.path, []byte(tc.body))
			if r.status != tc.status {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if tc.wantBody != "" && string(r.body) != tc.wantBody {
				t.Errorf("body %q, want %q", r.body, tc.wantBody)
			}
			last := ts.b.Invokes[len(ts.b.Invokes)-1]
			if last.Version != tc.wantVersion || string(last.Payload) != tc.wantPayload || last.Function != "echo" {
				t.Errorf("backend got %+v", last)
			}
			wantV := "2"
			if tc.wantVersion == 1 {
				wantV = "1"
			}
			h := r.header
			if h.Get(api.HeaderCallID) == "" || h.Get(api.HeaderVersion) != wantV || h.Get(api.HeaderStart) != "warm" {
				t.Errorf("headers %v", h)
			}
			if st := h.Get("Server-Timing"); st != "start;dur=1.500, handler;dur=12.000" {
				t.Errorf("Server-Timing %q", st)
			}
			if got := h.Get(api.HeaderFunctionError); (got == "Unhandled") != tc.fnError {
				t.Errorf("%s %q", api.HeaderFunctionError, got)
			}
			if tc.fnError {
				var fe function.Error
				if err := json.Unmarshal(r.body, &fe); err != nil || fe.ErrorType != "ValueError" || fe.ErrorMessage != "boom" || len(fe.StackTrace) != 1 {
					t.Errorf("error body %s (%v)", r.body, err)
				}
			}
		})
	}
}

func TestInvokeV1Async(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	r := ts.do(t, "POST", "/v1/functions/echo/invoke?async=true", []byte(`{"k":"v"}`))
	if r.status != http.StatusAccepted {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var c function.Call
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatal(err)
	}
	if c.ID == "" || c.ID != r.header.Get(api.HeaderCallID) || c.Status != function.StatusQueued || c.Mode != "async" || c.Function != "echo" {
		t.Errorf("call %+v, headers %v", c, r.header)
	}
	if r.header.Get(api.HeaderVersion) != "1" || ts.b.Asyncs != 1 {
		t.Errorf("version header %q, asyncs %d", r.header.Get(api.HeaderVersion), ts.b.Asyncs)
	}
}

func TestInvokeV1BadInput(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	big := make([]byte, function.MaxPayloadBytes+1)
	for i := range big {
		big[i] = ' '
	}
	tests := []struct {
		name    string
		path    string
		body    []byte
		status  int
		code    string
		msgPart string
	}{
		{"bad name", "/v1/functions/a%20b/invoke", nil, 400, api.CodeInvalid, "[A-Za-z0-9_-]"},
		{"unknown function", "/v1/functions/nope/invoke", nil, 404, api.CodeNotFound, "nope"},
		{"unknown function async", "/v1/functions/nope/invoke?async=true", nil, 404, api.CodeNotFound, "nope"},
		{"malformed JSON", "/v1/functions/echo/invoke", []byte(`{"a":}`), 400, api.CodeInvalid, "invalid character '}' looking for beginning of value (at byte 6)"},
		{"trailing garbage", "/v1/functions/echo/invoke", []byte(`{} x`), 400, api.CodeInvalid, "after top-level value (at byte 4)"},
		{"truncated", "/v1/functions/echo/invoke", []byte(`[1,2`), 400, api.CodeInvalid, "unexpected end of JSON input"},
		{"too large", "/v1/functions/echo/invoke", big, 413, api.CodeTooLarge, "6 MB"},
		{"bad version", "/v1/functions/echo/invoke?version=-1", nil, 400, api.CodeInvalid, `invalid version "-1"`},
		{"missing version", "/v1/functions/echo/invoke?version=5", nil, 404, api.CodeNotFound, "version 5"},
		{"bad async", "/v1/functions/echo/invoke?async=maybe", nil, 400, api.CodeInvalid, `invalid async "maybe"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, ts.do(t, "POST", tc.path, tc.body), tc.status, tc.code, tc.msgPart)
		})
	}
	if len(ts.b.Invokes) != 0 {
		t.Errorf("%d bad calls reached the handler", len(ts.b.Invokes))
	}
}

// TestInvokeTooLargeStreamed sends an oversized body without a
// Content-Length, so only the MaxBytesReader can catch it.
func TestInvokeTooLargeStreamed(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	body := io.MultiReader(strings.NewReader(`"`), strings.NewReader(strings.Repeat("a", function.MaxPayloadBytes)), strings.NewReader(`"`))
	req, _ := http.NewRequest("POST", ts.URL+"/v1/functions/echo/invoke", struct{ io.Reader }{body})
	req.ContentLength = -1
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// A body of exactly the limit is accepted.
	exact := append(append([]byte(`"`), bytes.Repeat([]byte("a"), function.MaxPayloadBytes-2)...), '"')
	if r := ts.do(t, "POST", "/v1/functions/echo/invoke", exact); r.status != 200 {
		t.Fatalf("body of exactly %d bytes: %d", len(exact), r.status)
	}
}

func TestErrorClasses(t *testing.T) {
	tests := []struct {
		err     error
		status  int
		code    string
		msgPart string
	}{
		{fmt.Errorf("fn x: %w", errdefs.ErrNotFound), 404, api.CodeNotFound, "fn x"},
		{errdefs.Invalid("bad handler"), 400, api.CodeInvalid, "bad handler"},
		{fmt.Errorf("deploy x: %w", errdefs.ErrConflict), 409, api.CodeConflict, "deploy x"},
		{errdefs.TooLarge("result too big"), 413, api.CodeTooLarge, "result too big"},
		{fmt.Errorf("x at concurrency 4: %w", errdefs.ErrThrottled), 429, api.CodeThrottled, "concurrency 4"},
		{fmt.Errorf("no worker: %w", errdefs.ErrUnavailable), 503, api.CodeUnavailable, "no worker"},
		{fmt.Errorf("dispatch: %w", errdefs.ErrTimeout), 504, api.CodeTimeout, "dispatch"},
		{fmt.Errorf("nats: %w", context.DeadlineExceeded), 504, api.CodeTimeout, "nats"},
		{errors.New("dial tcp 10.0.0.7:4222: secret detail"), 500, api.CodeInternal, "internal error (ref "},
	}
	ts := newTestServer(t)
	ts.deploy(t, "f")
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			ts.b.SetErr(tc.err)
			defer ts.b.SetErr(nil)
			for _, rq := range []struct{ method, path string }{
				{"GET", "/v1/functions/f"},
				{"GET", "/v1/functions"},
				{"DELETE", "/v1/functions/f"},
				{"POST", "/v1/functions/f/invoke"},
				{"POST", "/v1/functions/f/invoke?async=1"},
				{"GET", "/v1/calls/c1"},
				{"GET", "/v1/functions/f/calls"},
				{"GET", "/v1/functions/f/logs"},
			} {
				r := ts.do(t, rq.method, rq.path, nil)
				wantError(t, r, tc.status, tc.code, tc.msgPart)
				if strings.Contains(string(r.body), "secret") {
					t.Errorf("%s %s leaks an internal error: %s", rq.method, rq.path, r.body)
				}
				if retry := r.header.Get("Retry-After"); (retry != "") != (tc.status == 429 || tc.status == 503) {
					t.Errorf("%s %s: Retry-After %q", rq.method, rq.path, retry)
				}
			}
		})
	}
}

func TestCalls(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	for i := 0; i < 3; i++ {
		ts.do(t, "POST", "/v1/functions/echo/invoke", []byte(`{}`))
	}
	tests := []struct {
		name   string
		path   string
		status int
		check  func(t *testing.T, r response)
	}{
		{"get", "/v1/calls/call-2", 200, func(t *testing.T, r response) {
			var c function.Call
			_ = json.Unmarshal(r.body, &c)
			if c.ID != "call-2" || c.Status != function.StatusSucceeded || string(c.Result) != `{"echo":{}}` {
				t.Errorf("call %s", r.body)
			}
		}},
		{"get unknown", "/v1/calls/nope", 404, func(t *testing.T, r response) { wantError(t, r, 404, api.CodeNotFound, "nope") }},
		{"get bad id", "/v1/calls/a%2Ab", 400, func(t *testing.T, r response) { wantError(t, r, 400, api.CodeInvalid, "invalid call id") }},
		{"list", "/v1/functions/echo/calls", 200, func(t *testing.T, r response) {
			var l api.CallList
			_ = json.Unmarshal(r.body, &l)
			if len(l.Calls) != 3 || l.Calls[0].ID != "call-3" {
				t.Errorf("calls %s", r.body)
			}
		}},
		{"list limit", "/v1/functions/echo/calls?limit=2", 200, func(t *testing.T, r response) {
			var l api.CallList
			_ = json.Unmarshal(r.body, &l)
			if len(l.Calls) != 2 {
				t.Errorf("calls %s", r.body)
			}
		}},
		{"list limit zero", "/v1/functions/echo/calls?limit=0", 400, func(t *testing.T, r response) { wantError(t, r, 400, api.CodeInvalid, "use 1-1000") }},
		{"list limit huge", "/v1/functions/echo/calls?limit=1001", 400, nil},
		{"list limit junk", "/v1/functions/echo/calls?limit=ten", 400, nil},
		{"list unknown", "/v1/functions/nope/calls", 404, nil},
		{"list bad name", "/v1/functions/n!/calls", 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ts.do(t, "GET", tc.path, nil)
			if r.status != tc.status {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func logLine(fn, call, text string) function.LogLine {
	return function.LogLine{Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Function: fn, Version: 1, CallID: call, Stream: "stdout", Text: text}
}

func TestLogs(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	ts.b.LogLines["echo"] = []function.LogLine{logLine("echo", "c1", "hello"), logLine("echo", "c1", "world")}

	r := ts.do(t, "GET", "/v1/functions/echo/logs", nil)
	if r.status != 200 || r.header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %v", r.status, r.header)
	}
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines %q", lines)
	}
	var l function.LogLine
	if err := json.Unmarshal([]byte(lines[1]), &l); err != nil || l.Text != "world" || l.CallID != "c1" {
		t.Errorf("line %q: %v", lines[1], err)
	}
	want := `{"ts":"2025-01-02T03:04:05Z","fn":"echo","version":1,"call":"c1","stream":"stdout","text":"hello"}`
	if lines[0] != want {
		t.Errorf("line %s, want %s", lines[0], want)
	}

	wantError(t, ts.do(t, "GET", "/v1/functions/nope/logs", nil), 404, api.CodeNotFound, "nope")
	wantError(t, ts.do(t, "GET", "/v1/functions/echo/logs?follow=perhaps", nil), 400, api.CodeInvalid, "invalid follow")
}

// TestLogsFollow reads lines while the stream is still open, which only
// works if the gateway flushes each line.
func TestLogsFollow(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	ts.b.LogLines["echo"] = []function.LogLine{logLine("echo", "", "old")}
	ts.b.Follow = make(chan function.LogLine)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/v1/functions/echo/logs?follow=true", nil)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	next := func() function.LogLine {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("stream ended: %v", sc.Err())
		}
		var l function.LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := next(); l.Text != "old" {
		t.Fatalf("first line %+v", l)
	}
	for _, text := range []string{"new 1", "new 2"} {
		ts.b.Follow <- logLine("echo", "c9", text)
		if l := next(); l.Text != text || l.CallID != "c9" {
			t.Fatalf("got %+v, want %q", l, text)
		}
	}
}

func TestHealthz(t *testing.T) {
	ts := newTestServer(t)
	r := ts.do(t, "GET", "/healthz", nil)
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"status":"ok"}` {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestUnmatchedRoutes(t *testing.T) {
	ts := newTestServer(t)
	wantError(t, ts.do(t, "GET", "/v1/nothing", nil), 404, api.CodeNotFound, "no route for GET /v1/nothing")
	r := ts.do(t, "PATCH", "/v1/functions/x", nil)
	wantError(t, r, 405, api.CodeMethodNotAllowed, "PATCH")
	if allow := r.header.Get("Allow"); !strings.Contains(allow, "PUT") || !strings.Contains(allow, "DELETE") {
		t.Errorf("Allow %q", allow)
	}
}

func TestMetrics(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	ts.do(t, "POST", "/v1/functions/echo/invoke", []byte(`{}`))
	ts.do(t, "POST", "/v1/functions/echo/invoke", []byte(`{"raise":"ValueError"}`))
	ts.do(t, "POST", "/v1/functions/echo/invoke", []byte(`{"raise":"has space"}`))
	ts.do(t, "POST", "/v1/functions/echo/invoke?async=true", nil)
	ts.do(t, "POST", "/v1/functions/ghost/invoke", nil)
	ts.do(t, "GET", "/no/such/route", nil)

	body := string(ts.do(t, "GET", "/metrics", nil).body)
	for _, want := range []string{
		`torpor_gateway_requests_total{code="200",route="POST /v1/functions/{name}/invoke"} 3`,
		`torpor_gateway_requests_total{code="202",route="POST /v1/functions/{name}/invoke"} 1`,
		`torpor_gateway_requests_total{code="404",route="POST /v1/functions/{name}/invoke"} 1`,
		`torpor_gateway_requests_total{code="404",route="unmatched"} 1`,
		`torpor_gateway_request_duration_seconds_count{route="PUT /v1/functions/{name}"} 1`,
		`torpor_calls_total{function="echo",outcome="succeeded"} 1`,
		`torpor_calls_total{function="echo",outcome="failed"} 2`,
		`torpor_calls_total{function="echo",outcome="queued"} 1`,
		`torpor_call_duration_seconds_count{function="echo"} 3`,
		`torpor_function_errors_total{function="echo",type="ValueError"} 1`,
		`torpor_function_errors_total{function="echo",type="other"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(body, "ghost") || strings.Contains(body, "/no/such") {
		t.Errorf("an unknown function or path became a label:\n%s", body)
	}

	// Deleting a function drops its series.
	ts.do(t, "DELETE", "/v1/functions/echo", nil)
	body = string(ts.do(t, "GET", "/metrics", nil).body)
	if strings.Contains(body, `function="echo"`) {
		t.Errorf("series of a deleted function remain")
	}
}

func TestMetricsSharedRegistry(t *testing.T) {
	// Two servers on one registry must not fail or panic.
	reg := prometheus.NewRegistry()
	New(gatewaytest.NewBackend(), Options{Registry: reg})
	s := New(gatewaytest.NewBackend(), Options{Registry: reg})
	if s.metrics.calls == nil {
		t.Fatal("no metrics")
	}
}

func TestErrorTypeLabelBound(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), slog.Default())
	for i := 0; i < maxErrorTypesPerFunction; i++ {
		if got := m.errorTypeLabel("f", fmt.Sprintf("E%d", i)); got != fmt.Sprintf("E%d", i) {
			t.Fatalf("type %d became %q", i, got)
		}
	}
	if got := m.errorTypeLabel("f", "OneTooMany"); got != "other" {
		t.Errorf("got %q, want other", got)
	}
	if got := m.errorTypeLabel("f", "E3"); got != "E3" {
		t.Errorf("a known type became %q", got)
	}
	if got := m.errorTypeLabel("g", "OneTooMany"); got != "OneTooMany" {
		t.Errorf("bound leaked across functions: %q", got)
	}
}

func TestDeployBase64(t *testing.T) {
	// The deploy body carries the zip as standard base64.
	ts := newTestServer(t)
	body := `{"handler":"app.handler","code_zip":"` + base64.StdEncoding.EncodeToString([]byte("zipbytes")) + `"}`
	r := ts.do(t, "PUT", "/v1/functions/b64", []byte(body))
	if r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var v function.Version
	_ = json.Unmarshal(r.body, &v)
	if v.CodeSize != 8 {
		t.Errorf("code size %d", v.CodeSize)
	}
}

var _ Backend = (*gatewaytest.Backend)(nil)
