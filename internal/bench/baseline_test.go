package bench

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestBaseline(t *testing.T) {
	py := requirePython(t)
	ctx := context.Background()
	b, err := StartBaseline(ctx, py)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if !strings.HasPrefix(b.URL, "http://127.0.0.1:") {
		t.Fatalf("URL %q, want a loopback one", b.URL)
	}

	tests := []struct {
		name     string
		n, conc  int
		wantConn int // at most this many connections: keep-alive works
	}{
		{"sequential", 50, 1, 1},
		{"concurrent", 200, 8, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hc := newHTTPClient(tc.conc)
			conns := countConns(hc)
			res, elapsed, err := runCalls(ctx, hc, target{series: SeriesBaseline, url: b.URL + "/"}, tc.n, tc.conc)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("call %d: %v", i, r.err)
				}
				if r.latency <= 0 || r.latency > elapsed {
					t.Fatalf("call %d: latency %v outside the run's %v", i, r.latency, elapsed)
				}
			}
			if n := conns(); n > tc.wantConn {
				t.Errorf("%d connections for %d calls at concurrency %d, want at most %d: keep-alive is broken", n, tc.n, tc.conc, tc.wantConn)
			}
		})
	}

	b.Close()
	b.Close() // idempotent
	if _, err := http.Post(b.URL+"/", "application/json", strings.NewReader("{}")); err == nil {
		t.Errorf("the baseline still answers after Close")
	}
}

func TestBaselineBadInterpreter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := StartBaseline(ctx, "/bin/false"); err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("err = %v, want one saying the server did not start", err)
	}
	if _, err := StartBaseline(ctx, "/nonexistent/python"); err == nil || !strings.Contains(err.Error(), "/nonexistent/python") {
		t.Fatalf("err = %v, want one naming the interpreter", err)
	}
}
