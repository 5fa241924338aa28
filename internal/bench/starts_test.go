package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

var fixedNow = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// checkPNG fails t unless dir/name is a plot.
func checkPNG(t *testing.T, dir, name string) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if cfg, err := png.DecodeConfig(f); err != nil || cfg.Width != PlotWidth || cfg.Height != PlotHeight {
		t.Errorf("%s: %v %+v", name, err, cfg)
	}
	if keep := os.Getenv("BENCH_PLOT_DIR"); keep != "" { // to look at them
		b, _ := os.ReadFile(filepath.Join(dir, name))
		_ = os.WriteFile(filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_")+"_"+name), b, 0o644)
	}
}

// readJSON decodes dir/results.json into v.
func readJSON(t *testing.T, dir string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("results.json: %v", err)
	}
}

func TestStarts(t *testing.T) {
	py := requirePython(t)
	fake := &fakePlatform{token: "tok-0123456789"}
	url := newFakePlatform(t, fake)
	dir := t.TempDir()
	var out bytes.Buffer
	rep, err := Starts(context.Background(), StartsOptions{
		PlatformOptions: PlatformOptions{Endpoint: url, Token: "tok-0123456789", OutDir: dir, Python: py, Now: fixedNow},
		Calls:           50, Warmup: 5, Samples: 10, Fresh: 4,
	}, &out)
	if err != nil {
		t.Fatalf("Starts: %v\n%s", err, out.String())
	}
	if testing.Verbose() {
		t.Log(out.String())
	}
	want := []struct {
		series, path string
		n            int
	}{{SeriesFork, "", 10}, {SeriesStartHot, "hot", 50}, {SeriesStartWarm, "warm", 10}, {SeriesStartCold, "cold", 10}, {SeriesStartColdNew, "cold", 4}}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d series, want %d", len(rep.Results), len(want))
	}
	for i, w := range want {
		s := rep.Results[i]
		if s.Series != w.series || s.Path != w.path || s.N != w.n || s.Failures != 0 || s.Method == "" {
			t.Errorf("series %d: %s path %q n=%d failures=%d, want %+v", i, s.Series, s.Path, s.N, s.Failures, w)
		}
		if w.path != "" && (s.OnPath != w.n || s.RatioP50 <= 0 || len(s.ServerStartUS) != w.n) {
			t.Errorf("%s: on path %d, ratio %g, %d Server-Timings: want every call on its path", s.Series, s.OnPath, s.RatioP50, len(s.ServerStartUS))
		}
	}
	if rep.Failures() != 0 || len(rep.Targets) != 3 || !rep.Targets[2].Met {
		t.Errorf("failures %d, targets %+v", rep.Failures(), rep.Targets)
	}
	// Warm and cold drops around every sample (warm-ups too), one per
	// fresh function; the fresh functions are gone again.
	if want := 2*(10+startsSampleWarmup) + 4 + startsSampleWarmup; fake.drops != want {
		t.Errorf("%d drops, want %d", fake.drops, want)
	}
	if names := fake.names("bench-"); len(names) != 1 || names[0] != DefaultStartsFunction {
		t.Errorf("functions left: %v, want only %s", names, DefaultStartsFunction)
	}
	for _, s := range []string{"p50/base", "targets", "Server-Timing", "torpor-cold-new", "keep_templates=true"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	var back StartsReport
	readJSON(t, dir, &back)
	if back.Kind != "starts" || len(back.Results) != 5 || len(back.Results[1].LatenciesUS) != 50 || back.Results[2].Path != "warm" {
		t.Errorf("results.json does not hold the report: %+v", back.Results)
	}
	rows := csvRows(t, filepath.Join(dir, "results.csv"))
	if rows[0] != "series,i,"+callCSVColumns || len(rows) != 1+10+50+10+10+4 {
		t.Errorf("results.csv: header %q, %d rows", rows[0], len(rows))
	}
	if !strings.HasPrefix(rows[len(rows)-1], SeriesStartColdNew+",3,") || !strings.Contains(rows[len(rows)-1], ",true,cold,4500,100") {
		t.Errorf("last row %q", rows[len(rows)-1])
	}
	checkPNG(t, dir, "latency.png")
}

func TestStartsErrors(t *testing.T) {
	py := requirePython(t)
	old := newFakePlatform(t, &fakePlatform{noDrop: true})
	tests := []struct {
		name    string
		opts    StartsOptions
		class   error
		message string
	}{
		{"no endpoint", StartsOptions{}, errdefs.ErrInvalid, "pass --endpoint"},
		{"bad samples", StartsOptions{PlatformOptions: PlatformOptions{Endpoint: old}, Samples: -1}, errdefs.ErrInvalid, "--samples"},
		{"older torpor", StartsOptions{PlatformOptions: PlatformOptions{Endpoint: old}, Calls: 2, Samples: 2, Warmup: -1}, errdefs.ErrNotFound, "no route for DELETE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Python = py
			_, err := Starts(context.Background(), tc.opts, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.message) || !errors.Is(err, tc.class) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.class, tc.message)
			}
		})
	}
}

func TestStartsFailures(t *testing.T) {
	py := requirePython(t)
	url := newFakePlatform(t, &fakePlatform{failPrefix: "bench-sn-"})
	var out bytes.Buffer
	rep, err := Starts(context.Background(), StartsOptions{
		PlatformOptions: PlatformOptions{Endpoint: url, Python: py, Now: fixedNow},
		Calls:           5, Warmup: -1, Samples: 3, Fresh: 6,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failures() != 6 || !strings.Contains(out.String(), "6 measured calls failed") || !strings.Contains(out.String(), "instance crashed") {
		t.Errorf("failures %d:\n%s", rep.Failures(), out.String())
	}
}

func TestRatioSigAndStartMix(t *testing.T) {
	for r, want := range map[float64]string{0: "-", 0.0234: "0.023x", 0.5: "0.5x", 1.234: "1.2x", 42.4: "42x"} {
		if got := ratioSig(r); got != want {
			t.Errorf("ratioSig(%g) = %q, want %q", r, got, want)
		}
	}
	if got := startMix(map[string]int{"cold": 1, "hot": 2, "odd": 1}); got != "hot 50% cold 25% odd 25%" {
		t.Errorf("startMix = %q", got)
	}
	if got := startMix(nil); got != "-" {
		t.Errorf("startMix(nil) = %q", got)
	}
}

func TestErrorSet(t *testing.T) {
	var s errorSet
	for i := 0; i < 20; i++ {
		s.add("fn", errors.New(strings.Repeat("x", i%7)))
	}
	s.add("", nil)
	if s.N != 20 || len(s.Messages) != 5 || s.Messages[0] != "fn: " || s.Messages[1] != "fn: x" {
		t.Errorf("errorSet %d %q", s.N, s.Messages)
	}
}

func TestCallCSVFields(t *testing.T) {
	tests := []struct {
		c    callResult
		want string
	}{
		{callResult{latency: 1500 * time.Microsecond, start: "warm", serverStart: 900 * time.Microsecond, serverHandler: 100 * time.Microsecond}, "1500,true,warm,900,100"},
		{callResult{latency: time.Millisecond, err: errors.New("x"), serverStart: -1, serverHandler: -1}, "1000,false,,,"},
	}
	for _, tc := range tests {
		if got := callCSVFields(tc.c); got != tc.want {
			t.Errorf("callCSVFields = %q, want %q", got, tc.want)
		}
	}
}
