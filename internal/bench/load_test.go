package bench

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// countConns makes hc count the TCP connections it dials; the returned
// function reads the count.
func countConns(hc *http.Client) func() int {
	var n atomic.Int64
	tr := hc.Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return dial(ctx, network, addr)
	}
	return func() int { return int(n.Load()) }
}

func TestCall(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		torpor  bool
		wantErr string // "" = success
		start   string
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}")) }, false, "", ""},
		{"ok with newline", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}\n")) }, false, "", ""},
		{"torpor headers", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Torpor-Start", "hot")
			w.Header().Set("Server-Timing", "start;dur=0.010, handler;dur=0.050")
			w.Write([]byte("{}"))
		}, true, "", "hot"},
		{"wrong status", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(503)
			w.Write([]byte(`{"error":"no worker","code":"unavailable"}`))
		}, true, "HTTP 503: {\"error\":\"no worker\"", ""},
		{"wrong body", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"a":1}`)) }, false, `answer "{\"a\":1}", want {}`, ""},
		{"function error", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Torpor-Function-Error", "Unhandled")
			w.Write([]byte(`{"errorType":"ValueError"}`))
		}, true, "function error", ""},
		{"lambda function error", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
			w.Write([]byte(`{}`))
		}, true, "function error", ""},
		{"connection dropped", func(w http.ResponseWriter, r *http.Request) {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		}, false, "EOF", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			events := make(chan string, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
					t.Errorf("%s with Content-Type %q, want a JSON POST", r.Method, r.Header.Get("Content-Type"))
				}
				buf := make([]byte, 16)
				n, _ := r.Body.Read(buf)
				events <- string(buf[:n])
				tc.handler(w, r)
			}))
			t.Cleanup(srv.Close)
			r := call(context.Background(), newHTTPClient(1), target{url: srv.URL, torpor: tc.torpor})
			if got := <-events; got != "{}" {
				t.Errorf("event %q, want {}", got)
			}
			switch {
			case tc.wantErr == "" && r.err != nil:
				t.Fatalf("err = %v", r.err)
			case tc.wantErr != "" && (r.err == nil || !strings.Contains(r.err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one containing %q", r.err, tc.wantErr)
			}
			if r.start != tc.start {
				t.Errorf("start %q, want %q", r.start, tc.start)
			}
			if r.latency <= 0 {
				t.Errorf("latency %v, want > 0 even on failure", r.latency)
			}
		})
	}
}

// A target's Authorization goes with every call; a target without one
// (the baseline) sends none.
func TestCallAuthorization(t *testing.T) {
	for _, auth := range []string{"", "Bearer tok-0123456789abcdef"} {
		got := make(chan []string, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- r.Header.Values("Authorization")
			w.Write([]byte("{}"))
		}))
		r := call(context.Background(), newHTTPClient(1), target{url: srv.URL, auth: auth})
		srv.Close()
		if r.err != nil {
			t.Fatalf("auth %q: %v", auth, r.err)
		}
		h := <-got
		if auth == "" && len(h) != 0 || auth != "" && (len(h) != 1 || h[0] != auth) {
			t.Errorf("target auth %q: the server got Authorization %q", auth, h)
		}
	}
}

func TestRunCalls(t *testing.T) {
	var inflight, peak atomic.Int64
	var mu sync.Mutex
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		mu.Lock()
		peak.Store(max(peak.Load(), n))
		mu.Unlock()
		if n == 4 {
			close(block) // all four clients are in: let everyone go
		}
		<-block
		w.Write([]byte("{}"))
	}))
	t.Cleanup(srv.Close)
	hc := newHTTPClient(4)
	conns := countConns(hc)
	res, _, err := runCalls(context.Background(), hc, target{url: srv.URL}, 100, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 100 {
		t.Fatalf("%d results, want 100", len(res))
	}
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
	}
	if peak.Load() != 4 {
		t.Errorf("peak concurrency %d, want 4", peak.Load())
	}
	if conns() != 4 {
		t.Errorf("%d connections, want 4 kept alive", conns())
	}
}

func TestRunCallsCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 10 {
			cancel()
		}
		w.Write([]byte("{}"))
	}))
	t.Cleanup(srv.Close)
	_, _, err := runCalls(ctx, newHTTPClient(2), target{url: srv.URL}, 1_000_000, 2)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
