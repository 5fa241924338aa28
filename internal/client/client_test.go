package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

func newTestClient(t *testing.T) (*Client, *gatewaytest.Backend) {
	t.Helper()
	b := gatewaytest.NewBackend()
	ts := httptest.NewServer(gateway.New(b, gateway.Options{}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	return c, b
}

func TestFunctions(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	v, err := c.Deploy(ctx, function.Spec{Name: "hello", Handler: "app.handler", MemoryMB: 256}, []byte("zip"))
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "hello" || v.Version != 1 || v.MemoryMB != 256 || v.CodeSize != 3 {
		t.Errorf("deployed %+v", v)
	}
	if v, err = c.Deploy(ctx, function.Spec{Name: "hello", Handler: "app.other"}, []byte("zip2")); err != nil || v.Version != 2 {
		t.Fatalf("redeploy: %+v %v", v, err)
	}
	if v, err = c.Function(ctx, "hello", 1); err != nil || v.Handler != "app.handler" {
		t.Errorf("version 1: %+v %v", v, err)
	}
	if v, err = c.Function(ctx, "hello", 0); err != nil || v.Version != 2 {
		t.Errorf("latest: %+v %v", v, err)
	}
	fns, err := c.Functions(ctx)
	if err != nil || len(fns) != 1 || fns[0].Name != "hello" {
		t.Errorf("functions %+v %v", fns, err)
	}
	if err := c.Delete(ctx, "hello"); err != nil {
		t.Fatal(err)
	}
	if fns, err = c.Functions(ctx); err != nil || fns == nil || len(fns) != 0 {
		t.Errorf("after delete: %#v %v", fns, err)
	}
}

func TestErrors(t *testing.T) {
	c, b := newTestClient(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		backend error
		call    func() error
		class   error
		status  int
		msgPart string
	}{
		{"not found", nil, func() error { _, err := c.Function(ctx, "ghost", 0); return err }, errdefs.ErrNotFound, 404, `"ghost"`},
		{"bad spec", nil, func() error {
			_, err := c.Deploy(ctx, function.Spec{Name: "f", Handler: "nodot"}, []byte("z"))
			return err
		}, errdefs.ErrInvalid, 400, "MODULE.FUNCTION"},
		{"bad name, caught locally", nil, func() error { return c.Delete(ctx, "no/slash") }, errdefs.ErrInvalid, 0, "[A-Za-z0-9_-]"},
		{"throttled", fmt.Errorf("limit 2 reached: %w", errdefs.ErrThrottled), func() error { _, err := c.Invoke(ctx, "f", 0, nil); return err }, errdefs.ErrThrottled, 429, "limit 2"},
		{"unavailable", fmt.Errorf("no worker: %w", errdefs.ErrUnavailable), func() error { _, err := c.Calls(ctx, "f", 5); return err }, errdefs.ErrUnavailable, 503, "no worker"},
		{"bad event", nil, func() error { _, err := c.Invoke(ctx, "f", 0, []byte("{")); return err }, errdefs.ErrInvalid, 400, "invalid JSON event"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.SetErr(tc.backend)
			defer b.SetErr(nil)
			err := tc.call()
			if !errors.Is(err, tc.class) {
				t.Fatalf("error %v is not %v", err, tc.class)
			}
			if !strings.Contains(err.Error(), tc.msgPart) {
				t.Errorf("error %q lacks %q", err, tc.msgPart)
			}
			var apiErr *APIError
			if errors.As(err, &apiErr) != (tc.status != 0) || (apiErr != nil && apiErr.StatusCode != tc.status) {
				t.Errorf("APIError %+v, want status %d", apiErr, tc.status)
			}
		})
	}
}

func TestInvoke(t *testing.T) {
	c, b := newTestClient(t)
	ctx := context.Background()
	if _, err := c.Deploy(ctx, function.Spec{Name: "echo", Handler: "app.handler"}, []byte("z")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Invoke(ctx, "echo", 0, []byte(`{"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Payload) != `{"echo":{"x":1}}` || res.FunctionError != nil || res.CallID == "" || res.Version != 1 || res.Start != "warm" {
		t.Errorf("result %+v", res)
	}
	if res.StartTime != 1500*time.Microsecond || res.Duration != 12*time.Millisecond {
		t.Errorf("timing %v %v", res.StartTime, res.Duration)
	}
	if res, err = c.Invoke(ctx, "echo", 1, nil); err != nil || string(res.Payload) != `{"echo":{}}` || b.LastInvoke().Version != 1 {
		t.Errorf("nil event, version 1: %+v %v", res, err)
	}
	res, err = c.Invoke(ctx, "echo", 0, []byte(`{"raise":"TypeError"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res.FunctionError == nil || res.FunctionError.ErrorType != "TypeError" || res.FunctionError.ErrorMessage != "boom" {
		t.Errorf("function error %+v", res.FunctionError)
	}

	call, err := c.InvokeAsync(ctx, "echo", 0, []byte(`{}`))
	if err != nil || call.Status != function.StatusQueued || call.ID == "" {
		t.Fatalf("async %+v %v", call, err)
	}
	got, err := c.Call(ctx, call.ID)
	if err != nil || got.ID != call.ID {
		t.Errorf("call %+v %v", got, err)
	}
	calls, err := c.Calls(ctx, "echo", 2)
	if err != nil || len(calls) != 2 {
		t.Errorf("calls %+v %v", calls, err)
	}
	if _, err := c.Call(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown call: %v", err)
	}
}

func TestLogs(t *testing.T) {
	c, b := newTestClient(t)
	ctx := context.Background()
	if _, err := c.Deploy(ctx, function.Spec{Name: "echo", Handler: "app.handler"}, []byte("z")); err != nil {
		t.Fatal(err)
	}
	b.LogLines["echo"] = []function.LogLine{{Function: "echo", Text: "one"}, {Function: "echo", Text: "two"}}
	var got []string
	err := c.Logs(ctx, "echo", false, func(l function.LogLine) error { got = append(got, l.Text); return nil })
	if err != nil || strings.Join(got, ",") != "one,two" {
		t.Errorf("logs %v %v", got, err)
	}

	// Following: lines arrive while the stream is open; cancelling ends it
	// without an error.
	b.Follow = make(chan function.LogLine)
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	lines := make(chan string, 10)
	go func() {
		done <- c.Logs(fctx, "echo", true, func(l function.LogLine) error { lines <- l.Text; return nil })
	}()
	for _, want := range []string{"one", "two"} {
		if l := <-lines; l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
	}
	b.Follow <- function.LogLine{Text: "three"}
	if l := <-lines; l != "three" {
		t.Fatalf("followed line %q", l)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("follow ended with %v", err)
	}

	if err := c.Logs(ctx, "ghost", false, func(function.LogLine) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown function: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	c, err := New(url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Functions(context.Background())
	var ce *ConnError
	if !errors.As(err, &ce) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach torpor at "+url) {
		t.Fatalf("error %v", err)
	}
}

func TestNotAGateway(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "teapot here", http.StatusTeapot)
	}))
	defer ts.Close()
	c, _ := New(ts.URL)
	_, err := c.Functions(context.Background())
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 418 || !strings.Contains(err.Error(), "teapot here") || !strings.Contains(err.Error(), "a torpor gateway?") {
		t.Fatalf("error %v", err)
	}
}

func TestNew(t *testing.T) {
	for _, ep := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "::"} {
		if _, err := New(ep); err == nil {
			t.Errorf("New(%q) accepted", ep)
		}
	}
	c, err := New("https://torpor.example/base/")
	if err != nil || c.Endpoint() != "https://torpor.example/base" {
		t.Errorf("endpoint %v %v", c, err)
	}
}

func TestParseServerTiming(t *testing.T) {
	tests := []struct {
		in             string
		start, handler time.Duration
	}{
		{"start;dur=1.5, handler;dur=12", 1500 * time.Microsecond, 12 * time.Millisecond},
		{"handler;dur=3", 0, 3 * time.Millisecond},
		{"", 0, 0},
		{"start;dur=x, other;dur=5", 0, 0},
	}
	for _, tc := range tests {
		s, h := parseServerTiming(tc.in)
		if s != tc.start || h != tc.handler {
			t.Errorf("%q: %v %v", tc.in, s, h)
		}
	}
}
