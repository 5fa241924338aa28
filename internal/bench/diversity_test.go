package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestDiversity(t *testing.T) {
	py := requirePython(t)
	fake := &fakePlatform{}
	url := newFakePlatform(t, fake)
	dir := t.TempDir()
	var out bytes.Buffer
	rep, err := Diversity(context.Background(), DiversityOptions{
		PlatformOptions: PlatformOptions{Endpoint: url, OutDir: dir, Python: py, Now: fixedNow},
		Calls:           200, Concurrency: 4, MinFunctions: 4, MaxFunctions: 20, BaselineCalls: 12,
	}, &out)
	if err != nil {
		t.Fatalf("Diversity: %v\n%s", err, out.String())
	}
	if testing.Verbose() {
		t.Log(out.String())
	}
	if rep.Baseline.N != 12 || rep.Baseline.Throughput <= 0 || rep.Baseline.Starts != nil || rep.Failures() != 0 {
		t.Errorf("baseline %+v, failures %d", rep.Baseline.Summary, rep.Failures())
	}
	var ms []int
	for _, l := range rep.Levels {
		ms = append(ms, l.Functions)
		// Every level starts with nothing cached: each function called
		// has exactly one cold start (the fake makes one template).
		called := map[int]bool{}
		for _, f := range l.FunctionIndex {
			called[f] = true
		}
		if l.N != 200 || l.Starts["cold"] != len(called) || l.Starts["hot"] == 0 || l.RatioThroughput <= 0 || l.PSS <= 0 {
			t.Errorf("M=%d: n=%d starts %v (%d functions called), ratio %g, PSS %d", l.Functions, l.N, l.Starts, len(called), l.RatioThroughput, l.PSS)
		}
	}
	if !slices.Equal(ms, []int{4, 8, 16}) {
		t.Errorf("levels %v, want 4 8 16", ms)
	}
	if names := fake.names(diversityPrefix); len(names) != 0 {
		t.Errorf("functions left: %v", names)
	}
	for _, s := range []string{"calls/s / base", "cold", "deleted the 16 functions"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	var back DiversityReport
	readJSON(t, dir, &back)
	if back.Kind != "diversity" || len(back.Levels) != 3 || len(back.Levels[2].FunctionIndex) != 200 {
		t.Errorf("results.json does not hold the report")
	}
	rows := csvRows(t, filepath.Join(dir, "results.csv"))
	if len(rows) != 1+12+3*200 || !strings.HasPrefix(rows[1], SeriesFork+",4,0,bench-v-") || !strings.HasPrefix(rows[13], "torpor,4,0,bench-v-") {
		t.Errorf("results.csv: %d rows: %q %q", len(rows), rows[1], rows[13])
	}
	checkPNG(t, dir, "throughput.png")
}

func TestDiversityErrors(t *testing.T) {
	for _, tc := range []struct {
		opts    DiversityOptions
		message string
	}{
		{DiversityOptions{MinFunctions: 8, MaxFunctions: 4}, "--min-functions"},
		{DiversityOptions{Concurrency: -1}, "concurrency"},
	} {
		tc.opts.Endpoint = "http://127.0.0.1:1"
		_, err := Diversity(context.Background(), tc.opts, io.Discard)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("err = %v, want invalid with %q", err, tc.message)
		}
	}
}

func TestRandomSeq(t *testing.T) {
	a, b := randomSeq(1, 64, 6400), randomSeq(1, 64, 6400)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two sequences")
	}
	if slices.Equal(a, randomSeq(2, 64, 6400)) {
		t.Error("two seeds gave one sequence")
	}
	count := make([]int, 64)
	for _, v := range a {
		count[v]++
	}
	// 100 expected per function: uniform within generous bounds.
	if lo, hi := slices.Min(count), slices.Max(count); lo < 60 || hi > 140 {
		t.Errorf("counts from %d to %d, want about 100 each", lo, hi)
	}
}

func TestForEach(t *testing.T) {
	var mu = make(chan struct{}, 1)
	seen := map[int]bool{}
	err := forEach(context.Background(), 50, 4, func(_ context.Context, i int) error {
		mu <- struct{}{}
		seen[i] = true
		<-mu
		return nil
	})
	if err != nil || len(seen) != 50 {
		t.Fatalf("err %v, %d indexes", err, len(seen))
	}
	boom := errors.New("boom")
	err = forEach(context.Background(), 1000, 4, func(ctx context.Context, i int) error {
		if i == 3 {
			return boom
		}
		time.Sleep(time.Millisecond)
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
}
