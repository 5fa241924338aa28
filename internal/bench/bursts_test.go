package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestBursts(t *testing.T) {
	py := requirePython(t)
	tests := []struct {
		name     string
		fail     string
		failures bool
	}{
		{"clean", "", false},
		{"failing bursts", burstsPrefix, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakePlatform{sleep: 50 * time.Millisecond, failPrefix: tc.fail}
			url := newFakePlatform(t, fake)
			dir := t.TempDir()
			var out bytes.Buffer
			rep, err := Bursts(context.Background(), BurstsOptions{
				PlatformOptions: PlatformOptions{Endpoint: url, OutDir: dir, Python: py, Now: fixedNow},
				PhaseDuration:   time.Second, Intervals: []time.Duration{500 * time.Millisecond, 300 * time.Millisecond},
				BurstSize: 6, Rate: 20, BaselineDuration: 600 * time.Millisecond, Lead: 100 * time.Millisecond,
			}, &out)
			if err != nil {
				t.Fatalf("Bursts: %v\n%s", err, out.String())
			}
			if testing.Verbose() {
				t.Log(out.String())
			}
			// Bursts at interval/2 + k*interval before the phase's end.
			wantBursts := []int{2, 3, 2}
			if len(rep.Phases) != 3 || rep.Phases[2].System != SeriesFork {
				t.Fatalf("%d phases, want two torpor then the baseline", len(rep.Phases))
			}
			for i, ph := range rep.Phases {
				if len(ph.Bursts) != wantBursts[i] {
					t.Errorf("%s: %d bursts, want %d", ph.Name, len(ph.Bursts), wantBursts[i])
				}
				// 20 calls/s for the phase's length.
				if n := ph.Background.N + ph.Background.Failures; n < 11 || n > 21 {
					t.Errorf("%s: %d background calls", ph.Name, n)
				}
				if ph.Background.Failures != 0 || ph.Background.P50US < 50000 || ph.Background.Quiet.N+ph.Background.InBurst.N != ph.Background.N {
					t.Errorf("%s: background %+v", ph.Name, ph.Background.Summary)
				}
				for _, br := range ph.Bursts {
					if br.N+br.Failures != 6 || br.CompletionMS <= 0 || len(br.Calls) != 6 || (ph.System == "torpor" && br.Function == "") {
						t.Errorf("%s burst %d: %+v", ph.Name, br.Index, br)
					}
					if ph.System == "torpor" && !tc.failures && br.Starts["cold"] != 1 {
						t.Errorf("%s burst %d: starts %v, want one cold start (nothing cached)", ph.Name, br.Index, br.Starts)
					}
				}
				if i < 2 && !tc.failures && (ph.RatioBurstP50 <= 0 || ph.RatioBackgroundP99 <= 0) {
					t.Errorf("%s: ratios %g %g", ph.Name, ph.RatioBurstP50, ph.RatioBackgroundP99)
				}
			}
			if got := rep.Failures(); (got > 0) != tc.failures || (tc.failures && got != 5*6) {
				t.Errorf("%d failures", got)
			}
			if tc.failures && !strings.Contains(out.String(), "instance crashed") {
				t.Errorf("no error message:\n%s", out.String())
			}
			if names := fake.names("bench-b"); len(names) != 0 {
				t.Errorf("functions left: %v", names)
			}
			var back BurstsReport
			readJSON(t, dir, &back)
			if back.Kind != "bursts" || len(back.Phases) != 3 || len(back.Phases[0].Bursts[0].Calls) != 6 {
				t.Errorf("results.json does not hold the report")
			}
			rows := csvRows(t, filepath.Join(dir, "results.csv"))
			if !strings.HasPrefix(rows[0], "phase,kind,burst,send_s,") || !strings.HasPrefix(rows[1], "torpor every 500ms,background,,") {
				t.Errorf("results.csv %q %q", rows[0], rows[1])
			}
			checkPNG(t, dir, "timeline.png")
		})
	}
}

func TestBurstsOptions(t *testing.T) {
	for _, tc := range []struct {
		opts    BurstsOptions
		message string
	}{
		{BurstsOptions{Intervals: []time.Duration{2 * time.Minute}}, "intervals"},
		{BurstsOptions{BurstSize: 5000}, "burst of 5000"},
		{BurstsOptions{Lead: 9 * time.Second}, "lead"},
		{BurstsOptions{Rate: -1}, "rate"},
	} {
		tc.opts.Endpoint = "http://127.0.0.1:1"
		_, err := Bursts(context.Background(), tc.opts, io.Discard)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("err = %v, want invalid with %q", err, tc.message)
		}
	}
}

func TestBackgroundResult(t *testing.T) {
	bursts := []*BurstResult{{FireS: 10, CompletionMS: 500}, {FireS: 20, CompletionMS: 0}} // the second never ran
	calls := []TimedCall{
		{SendS: 9.0, LatencyUS: 50000, OK: true},  // before
		{SendS: 9.98, LatencyUS: 60000, OK: true}, // runs into the burst
		{SendS: 10.2, LatencyUS: 90000, OK: true}, // inside
		{SendS: 10.6, LatencyUS: 50000, OK: true}, // after
		{SendS: 20.1, LatencyUS: 50000, OK: true}, // the burst that never ran
		{SendS: 11, OK: false, res: callResult{err: errors.New("HTTP 503")}},
	}
	r := backgroundResult(calls, bursts)
	if r.N != 5 || r.Failures != 1 || r.InBurst.N != 2 || r.Quiet.N != 3 || r.InBurst.P50US != 60000 || len(r.Errors) != 1 {
		t.Errorf("background %+v quiet %+v in burst %+v", r.Summary, r.Quiet, r.InBurst)
	}
}
