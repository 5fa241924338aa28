package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func TestEvictOptionsNormalize(t *testing.T) {
	o := EvictOptions{OutDir: t.TempDir()}
	if err := o.normalize(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Parts, EvictParts) || o.Store != StoreLocal || o.TimeScale != 1 || o.Trials != DefaultEvictTrials ||
		o.Calls != DefaultEvictCalls || !slices.Equal(o.Rates, DefaultEvictRates) || o.Log == nil {
		t.Errorf("normalized %+v", o)
	}
	tests := []struct {
		name string
		opts EvictOptions
		want string
	}{
		{"unknown part", EvictOptions{OutDir: "out", Parts: []string{"speed"}}, `unknown part "speed"`},
		{"no output directory", EvictOptions{}, "no output directory"},
		{"unknown store", EvictOptions{OutDir: "out", Store: "s3"}, `unknown store "s3"`},
		{"n of 0", EvictOptions{OutDir: "out", N: []int{1, 0}}, "--n 0"},
		{"n too large", EvictOptions{OutDir: "out", N: []int{65}}, "--n 65"},
		{"rate of 0", EvictOptions{OutDir: "out", Rates: []float64{0}}, "--rates 0"},
		{"rate over 100", EvictOptions{OutDir: "out", Rates: []float64{101}}, "--rates 101"},
		{"too much memory", EvictOptions{OutDir: "out", MB: 2048}, "--mb 2048"},
		{"calls too short", EvictOptions{OutDir: "out", CallSeconds: 0.5}, "--call-seconds 0.5"},
		{"grace too short", EvictOptions{OutDir: "out", Grace: time.Millisecond}, "--grace 1ms"},
		{"negative trials", EvictOptions{OutDir: "out", Trials: -1}, "--trials"},
		{"time scale over 1", EvictOptions{OutDir: "out", TimeScale: 2}, "--time-scale 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.normalize()
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("normalize() = %v, want an invalid-argument error naming %q", err, tt.want)
			}
		})
	}
}

// The workload follows Table 5.3, is the same for the same seed, and its
// victims are distinct calls: those of a lower rate a prefix of a higher's.
func TestDrawWorkload(t *testing.T) {
	opts := EvictOptions{Calls: 4000, Rates: []float64{1, 20}, TimeScale: 1, Seed: 7}
	calls, counts, victims := drawWorkload(opts)
	if len(calls) != 4000 || len(victims) != 800 {
		t.Fatalf("%d calls, %d victims; want 4000 and 800 (20%%)", len(calls), len(victims))
	}
	total := 0
	for k, n := range counts {
		total += n
		share := 100 * float64(n) / 4000
		if math.Abs(share-evictMix[k].Percent) > 1.5 {
			t.Errorf("class %d (%d MB): %.2f%% of the calls, Table 5.3 says %.2f%%", k, evictMix[k].MB, share, evictMix[k].Percent)
		}
	}
	if total != 4000 {
		t.Errorf("class counts sum to %d", total)
	}
	for _, c := range calls {
		cl := evictMix[c.Class]
		if c.MB != cl.MB || c.Steps != int(cl.Seconds*1000/10) || c.At < 0 || c.At >= 0.95 {
			t.Fatalf("call %+v of class %+v", c, cl)
		}
	}
	seen := map[int]bool{}
	for _, v := range victims {
		if seen[v] || v < 0 || v >= len(calls) {
			t.Fatalf("victim %d repeated or out of range", v)
		}
		seen[v] = true
	}
	again, _, victims2 := drawWorkload(opts)
	if !slices.Equal(calls, again) || !slices.Equal(victims, victims2) {
		t.Error("the same seed drew another workload")
	}
	if victimsAt(1, 4000) != 40 || victimsAt(20, 4000) != 800 {
		t.Errorf("victimsAt: %d, %d", victimsAt(1, 4000), victimsAt(20, 4000))
	}
	opts.TimeScale = 0.05 // 2 s → 100 ms: 10 steps
	if c, _, _ := drawWorkload(opts); c[0].Steps != max(1, int(math.Round(evictMix[c[0].Class].Seconds*5))) {
		t.Errorf("scaled call %+v", c[0])
	}
}

// Overhead at a rate is the sum of the hit calls' costs (hit minus
// control), plus Kappa's checkpoints on every call, over the plain
// workload's total.
func TestEvictOverheadSummarize(t *testing.T) {
	r := &EvictOverheadRun{Calls: 4, Rates: []float64{25, 50, 100},
		Plain:    OverheadFull{LatencyMS: []float64{1000, 1000, 1000, 1000}},
		Kappa:    OverheadFull{LatencyMS: []float64{1100, 1100, 1100, 1100}},
		Overhead: map[string][]float64{},
		Hits: map[string][]OverheadHit{
			PolicyRCheck: {{I: 2, LatencyMS: 1300, ControlMS: 1000}, {I: 0, LatencyMS: 1100, ControlMS: 1000}},
			PolicyRerun:  {{I: 2, LatencyMS: 1800, ControlMS: 1000}, {I: 0, LatencyMS: 1400, ControlMS: 1000}},
			PolicyKappa:  {{I: 2, LatencyMS: 1500, ControlMS: 1100}},
		},
	}
	r.summarize()
	want := map[string][]float64{
		PolicyRCheck: {0.075, 0.1}, // 300/4000, 400/4000; 100 % has no victims run
		PolicyRerun:  {0.2, 0.3},   // 800/4000, 1200/4000
		PolicyKappa:  {0.1 + 0.1},  // 400 checkpoints + 400 for the hit
	}
	for p, w := range want {
		got := r.Overhead[p]
		if len(got) != len(w) {
			t.Errorf("%s: overhead %v, want %v", p, got, w)
			continue
		}
		for i := range w {
			if math.Abs(got[i]-w[i]) > 1e-9 {
				t.Errorf("%s at %g%%: %g, want %g", p, r.Rates[i], got[i], w[i])
			}
		}
	}
	if math.Abs(r.KappaNoEviction-0.1) > 1e-9 {
		t.Errorf("Kappa without evictions: %g, want 0.1", r.KappaNoEviction)
	}
}

// TestEvict runs every part of the benchmark, small, on real clusters of
// this build: its calls must all succeed, exactly once, and it writes its
// tables, raw results and plots.
func TestEvict(t *testing.T) {
	testenv.CRIU(t)
	bin := buildTorpor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := t.TempDir()
	var buf bytes.Buffer
	rep, err := Evict(ctx, EvictOptions{OutDir: out, Binary: bin, Store: StoreLocal,
		N: []int{1, 2}, MB: 8, CallSeconds: 6, Grace: 20 * time.Second,
		Trials: 4, Batch: 2,
		Calls: 12, Rates: []float64{25}, Concurrency: 4, TimeScale: 0.05, Log: testenv.Logger(t)}, &buf)
	t.Logf("output:\n%s", buf.String())
	if err != nil {
		t.Fatal(err)
	}
	if n := rep.Failures(); n != 0 {
		t.Fatalf("%d failed calls or mismatches", n)
	}
	for _, s := range rep.Concurrency.Steps {
		if s.Moved != s.N {
			t.Errorf("N=%d: %d calls moved", s.N, s.Moved)
		}
		for i, ck := range s.CheckpointMS {
			if ck <= 0 || s.RestoreMS[i] <= 0 || s.ImageBytes[i] <= 0 {
				t.Errorf("N=%d call %d: checkpoint %g ms, restore %g ms, image %d bytes", s.N, i, ck, s.RestoreMS[i], s.ImageBytes[i])
			}
		}
	}
	if len(rep.Once.Calls) != 4 {
		t.Errorf("%d exactly-once trials, want 4", len(rep.Once.Calls))
	}
	o := rep.Overhead
	for _, p := range overheadPolicies {
		if len(o.Hits[p]) != 3 || len(o.Overhead[p]) != 1 {
			t.Errorf("%s: %d hits, overhead %v; want 3 hits (25%% of 12) and one rate", p, len(o.Hits[p]), o.Overhead[p])
		}
		for _, h := range o.Hits[p] {
			if h.ControlMS <= 0 || h.LatencyMS <= 0 {
				t.Errorf("%s: hit %+v not measured", p, h)
			}
			if p == PolicyRerun && h.Moved || p == PolicyRCheck && h.Lost {
				t.Errorf("%s: hit %+v", p, h)
			}
		}
	}
	for _, f := range []string{"results.json", "results.csv", "concurrency.png", "exactly-once.png", "overhead.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	var back EvictReport
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || json.Unmarshal(b, &back) != nil || back.Overhead == nil {
		t.Errorf("results.json does not hold the report: %v", err)
	}
	for _, want := range []string{"concurrent checkpoints", "exactly once", "overhead vs eviction rate", "re-run / torpor"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the output has no %q", want)
		}
	}
}
