package bench

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// fakeTorpor is the part of the torpor HTTP API the warm benchmark uses.
type fakeTorpor struct {
	t          *testing.T
	deployCode int          // status of PUT; 0 = 201
	failEvery  int64        // the Lambda API fails every n-th call with 503; 0 = never
	token      string       // required as a Bearer token but on /healthz; "" = none
	refused    atomic.Int64 // requests refused for want of the token
	lambda     atomic.Int64
	rest       atomic.Int64
	mu         sync.Mutex
	deployed   *api.DeployRequest
}

func (f *fakeTorpor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ok := func() {
		w.Header().Set("X-Torpor-Start", "hot")
		w.Header().Set("Server-Timing", "start;dur=0.010, handler;dur=0.030")
		w.Write([]byte("{}"))
	}
	if f.token != "" && r.URL.Path != "/healthz" && r.Header.Get("Authorization") != "Bearer "+f.token {
		f.refused.Add(1)
		w.Header().Set("WWW-Authenticate", "Bearer")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":"missing or invalid API token","code":"unauthorized"}`))
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/healthz":
		w.Write([]byte(`{"status":"ok"}`))
	case r.Method == http.MethodPut && r.URL.Path == "/v1/functions/bench-nop":
		var req api.DeployRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			f.t.Errorf("deploy body: %v", err)
		}
		f.mu.Lock()
		f.deployed = &req
		f.mu.Unlock()
		if f.deployCode != 0 {
			w.WriteHeader(f.deployCode)
			w.Write([]byte(`{"error":"handler app.handler: no module named app: fix the code","code":"invalid"}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(function.Version{Spec: req.Spec, Version: 7})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/functions/bench-nop/invoke":
		f.rest.Add(1)
		ok()
	case r.Method == http.MethodPost && r.URL.Path == "/2015-03-31/functions/bench-nop/invocations":
		if n := f.lambda.Add(1); f.failEvery > 0 && n%f.failEvery == 0 {
			w.Header().Set("X-Amzn-ErrorType", "ServiceException")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"Type":"Service","message":"no worker","__type":"ServiceException"}`))
			return
		}
		ok()
	default:
		f.t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusNotFound)
	}
}

func TestWarm(t *testing.T) {
	py := requirePython(t)
	fake := &fakeTorpor{t: t, failEvery: 25, token: "bench-token-0123456789"}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	dir := filepath.Join(t.TempDir(), "out")
	var out bytes.Buffer
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rep, err := Warm(context.Background(), WarmOptions{
		Endpoint: srv.URL + "/", Token: "bench-token-0123456789", Calls: 100, Warmup: 10, Concurrency: []int{1, 3},
		OutDir: dir, Python: py, Now: func() time.Time { return now },
	}, &out)
	if err != nil {
		t.Fatalf("Warm: %v\n%s", err, out.String())
	}
	// Every torpor request carried the token (the deploy and both series).
	if n := fake.refused.Load(); n != 0 {
		t.Errorf("%d requests reached torpor without the token", n)
	}

	// The deploy is the NOP function, as specified.
	d := fake.deployed
	if d == nil || d.Name != "bench-nop" || d.Runtime != "python3" || d.Handler != "app.handler" || d.MemoryMB != 128 || d.TimeoutSec != 3 {
		t.Fatalf("deployed %+v", d)
	}
	if code := unzipOne(t, d.CodeZip, "app.py"); code != nopCode {
		t.Errorf("app.py = %q, want %q", code, nopCode)
	}
	if got := fake.rest.Load(); got != 2*(100+10) {
		t.Errorf("%d REST calls, want %d", got, 2*110)
	}

	// The report.
	if rep.FunctionVersion != 7 || rep.Machine.NProc == 0 || rep.Machine.GoVersion == "" || !rep.StartedAt.Equal(now) {
		t.Errorf("report header %+v", rep)
	}
	type key struct {
		series string
		c      int
	}
	want := []key{{SeriesBaseline, 1}, {SeriesTorporREST, 1}, {SeriesTorporLambda, 1}, {SeriesBaseline, 3}, {SeriesTorporREST, 3}, {SeriesTorporLambda, 3}}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(want))
	}
	totalFailures := 0
	for i, s := range rep.Results {
		if (key{s.Series, s.Concurrency}) != want[i] {
			t.Errorf("result %d is %s c=%d, want %v", i, s.Series, s.Concurrency, want[i])
		}
		if s.N+s.Failures != 100 || len(s.LatenciesUS) != s.N {
			t.Errorf("%s c=%d: n=%d failures=%d latencies=%d, want 100 calls", s.Series, s.Concurrency, s.N, s.Failures, len(s.LatenciesUS))
		}
		switch s.Series {
		case SeriesBaseline:
			if s.Failures != 0 || s.Hot != 0 || s.Starts != nil || s.RatioP50 != 0 {
				t.Errorf("baseline %+v", s.Summary)
			}
		case SeriesTorporREST:
			if s.Hot != 100 || s.Failures != 0 || s.RatioP50 <= 0 || s.RatioP99 <= 0 || len(s.ServerHandlerUS) != 100 || s.ServerHandlerUS[0] != 30 {
				t.Errorf("REST: hot=%d failures=%d ratios %g %g handler %v", s.Hot, s.Failures, s.RatioP50, s.RatioP99, s.ServerHandlerUS[:1])
			}
		case SeriesTorporLambda:
			if s.Failures == 0 || len(s.Errors) != 1 || !strings.Contains(s.Errors[0], "HTTP 503") || s.Hot != s.N {
				t.Errorf("Lambda: failures=%d errors=%q hot=%d", s.Failures, s.Errors, s.Hot)
			}
		}
		totalFailures += s.Failures
	}
	// 10+100 Lambda calls per level, every 25th fails: 4 measured failures each.
	if rep.Failures() != totalFailures || totalFailures != 8 {
		t.Errorf("Failures() = %d (sum %d), want 8", rep.Failures(), totalFailures)
	}

	// The printed tables.
	for _, s := range []string{"p50/base", "torpor-lambda", "HTTP 503", "Server-Timing", "results.json"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	// The files.
	var fromJSON WarmReport
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fromJSON); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if fromJSON.Kind != "warm" || len(fromJSON.Results) != 6 || len(fromJSON.Results[1].LatenciesUS) != 100 || fromJSON.Machine.CPUModel != rep.Machine.CPUModel {
		t.Errorf("results.json does not hold the report")
	}
	rows := csvRows(t, filepath.Join(dir, "results.csv"))
	if rows[0] != "series,concurrency,i,latency_us,ok" || len(rows) != 1+6*100 {
		t.Errorf("results.csv: header %q and %d rows, want 601", rows[0], len(rows))
	}
	if !strings.HasPrefix(rows[1], SeriesBaseline+",1,0,") {
		t.Errorf("first row %q", rows[1])
	}
	if n := strings.Count(strings.Join(rows, "\n"), ",false"); n != 8 {
		t.Errorf("%d failed rows in the CSV, want 8", n)
	}
	f, err := os.Open(filepath.Join(dir, "latency.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if cfg, err := png.DecodeConfig(f); err != nil || cfg.Width != PlotWidth || cfg.Height != PlotHeight {
		t.Errorf("latency.png: %v %+v", err, cfg)
	}
}

func TestWarmErrors(t *testing.T) {
	py := requirePython(t)
	rejecting := httptest.NewServer(&fakeTorpor{t: t, deployCode: http.StatusBadRequest})
	t.Cleanup(rejecting.Close)
	guarded := httptest.NewServer(&fakeTorpor{t: t, token: "right-token-0123456789"})
	t.Cleanup(guarded.Close)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	tests := []struct {
		name    string
		opts    WarmOptions
		class   error
		message string
	}{
		{"no endpoint", WarmOptions{}, errdefs.ErrInvalid, "pass --endpoint"},
		{"bad concurrency", WarmOptions{Endpoint: rejecting.URL, Concurrency: []int{0}}, errdefs.ErrInvalid, "concurrency 0"},
		{"bad calls", WarmOptions{Endpoint: rejecting.URL, Calls: -1}, errdefs.ErrInvalid, "--calls"},
		{"nobody there", WarmOptions{Endpoint: down.URL}, errdefs.ErrUnavailable, "torpor up"},
		{"deploy rejected", WarmOptions{Endpoint: rejecting.URL}, errdefs.ErrInvalid, "no module named app"},
		{"wrong token", WarmOptions{Endpoint: guarded.URL, Token: "wrong-token-0123456789"}, nil, "refused the API token"},
		{"no token", WarmOptions{Endpoint: guarded.URL}, nil, "wants an API token"},
		{"no python", WarmOptions{Endpoint: rejecting.URL, Python: "/nonexistent/python3"}, nil, "/nonexistent/python3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.Python == "" {
				tc.opts.Python = py
			}
			_, err := Warm(context.Background(), tc.opts, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.message) || (tc.class != nil && !errors.Is(err, tc.class)) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.class, tc.message)
			}
		})
	}
}

func unzipOne(t *testing.T, zipBytes []byte, name string) string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(zipBytes), int64(len(zipBytes)))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := zr.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

func csvRows(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rows = append(rows, sc.Text())
	}
	return rows
}
