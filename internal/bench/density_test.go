package bench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestDensity(t *testing.T) {
	py := requirePython(t)
	tests := []struct {
		name       string
		maxCached  int
		failPrefix string
		opts       DensityOptions
		stop       string
		deployed   int
		cached     int
		failures   int
		wantOutput string
	}{
		{"plateau", 12, "", DensityOptions{Plateau: 5}, "plateau", 17, 12, 0, "functions per GiB"},
		{"max", 0, "", DensityOptions{Max: 9}, "max", 9, 9, 0, "target: <= 1.00 MiB"},
		// 6 MiB runtime template + 2.5 MiB per function: 20 MiB at 6.
		{"budget", 0, "", DensityOptions{BudgetMB: 20}, "budget", 6, 6, 0, "met"},
		{"failed calls", 0, "bench-d-000", DensityOptions{Max: 12}, "max", 12, 12, 9, "instance crashed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakePlatform{maxCached: tc.maxCached, failPrefix: tc.failPrefix}
			url := newFakePlatform(t, fake)
			// A leftover of an interrupted run is deleted first.
			fake.fns["bench-d-0099"] = &fakeFn{template: true}
			dir := t.TempDir()
			tc.opts.PlatformOptions = PlatformOptions{Endpoint: url, OutDir: dir, Python: py, Now: fixedNow}
			var out bytes.Buffer
			rep, err := Density(context.Background(), tc.opts, &out)
			if err != nil {
				t.Fatalf("Density: %v\n%s", err, out.String())
			}
			if testing.Verbose() {
				t.Log(out.String())
			}
			last := rep.Points[len(rep.Points)-1]
			if !strings.HasPrefix(rep.StopReason, tc.stop) || last.Deployed != tc.deployed || last.Cached != tc.cached || rep.Failures != tc.failures {
				t.Errorf("stopped %q at %d deployed, %d cached, %d failures; want %s at %d, %d, %d",
					rep.StopReason, last.Deployed, last.Cached, rep.Failures, tc.stop, tc.deployed, tc.cached, tc.failures)
			}
			if tc.failures > 0 && len(rep.Errors) == 0 {
				t.Error("no error messages")
			}
			if names := fake.names(densityPrefix); len(names) != 0 {
				t.Errorf("functions left: %v", names)
			}
			if rep.Points[0].Deployed != 0 || rep.Points[0].Processes < 1 || rep.Baseline.USS <= 0 {
				t.Errorf("first point %+v, baseline %+v", rep.Points[0], rep.Baseline)
			}
			if tc.failures == 0 {
				// The fake's template: 800 KiB USS, 1.5 MiB PSS; an idle
				// instance 600 KiB USS, 1 MiB PSS.
				if rep.Templates.N != tc.cached || rep.Templates.USSMedian != 800<<10 || rep.Instances.PSSP90 != 1<<20 ||
					rep.PerFunctionPSS != 5<<19 || !rep.TargetMet || rep.RatioTemplateUSS <= 0 {
					t.Errorf("templates %+v, instances %+v, per function %d, target %t", rep.Templates, rep.Instances, rep.PerFunctionPSS, rep.TargetMet)
				}
			}
			if !strings.Contains(out.String(), tc.wantOutput) || !strings.Contains(out.String(), "deleted 1 bench-d-* functions left") {
				t.Errorf("output lacks %q:\n%s", tc.wantOutput, out.String())
			}
			var back DensityReport
			readJSON(t, dir, &back)
			if back.Kind != "density" || len(back.Points) != len(rep.Points) || len(back.Processes) != len(rep.Processes) {
				t.Errorf("results.json does not hold the report")
			}
			if rows := csvRows(t, filepath.Join(dir, "results.csv")); len(rows) != 1+len(rep.Points) || !strings.HasPrefix(rows[2], "1,bench-d-0001,") {
				t.Errorf("results.csv: %d rows, second %q", len(rows), rows[2])
			}
			if rows := csvRows(t, filepath.Join(dir, "processes.csv")); len(rows) != 1+len(rep.Processes) {
				t.Errorf("processes.csv: %d rows", len(rows))
			}
			checkPNG(t, dir, "cached.png")
			checkPNG(t, dir, "memory.png")
		})
	}
}
