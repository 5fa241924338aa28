package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// BenchmarkStart measures Start -> exec of /bin/true (cgroup creation, the
// init's namespaces, mounts and privilege drop, up to the moment the exec
// closes the status pipe) against a baseline measured in the same run: a
// plain fork+exec of /bin/true with os/exec (Cmd.Start also returns once
// the exec happened). Destroy is timed separately. Run with
//
//	go test -run '^$' -bench Start -benchtime 300x ./internal/sandbox/
//
// ns/op is the mean; p50-ns and p90-ns are the median and 90th
// percentile, which cold-start budgets are written against. The init is the
// test binary unless TORPOR_BENCH_INIT names another binary whose main
// calls InitMain, e.g. the torpor binary itself (whose dependencies' package
// initialisation then runs in every init):
//
//	go build -o /tmp/torpor ./cmd/torpor
//	TORPOR_BENCH_INIT=/tmp/torpor go test -run '^$' -bench Start ./internal/sandbox/
func BenchmarkStart(b *testing.B) {
	requireRoot(b)
	var base time.Duration
	b.Run("baseline-fork-exec", func(b *testing.B) {
		var starts []time.Duration
		for b.Loop() {
			cmd := exec.Command("/bin/true")
			t0 := time.Now()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			starts = append(starts, time.Since(t0))
			b.StopTimer()
			_ = cmd.Wait()
			b.StartTimer()
		}
		base = percentile(starts, 50)
		reportPercentiles(b, starts, "")
	})
	b.Run("sandbox", func(b *testing.B) {
		cfg := testConfig(b)
		cfg.InitPath = os.Getenv("TORPOR_BENCH_INIT")
		m, err := NewManager(context.Background(), cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(context.Background()) })
		uid := testUID()
		var starts, destroys []time.Duration
		for i := 0; b.Loop(); i++ {
			spec := Spec{
				ID: fmt.Sprintf("bench-%d", i), UID: uid, GID: uid,
				Argv:   []string{"/bin/true"},
				Limits: Limits{MemoryMB: 128, CPUShares: 1024, Pids: 64},
			}
			t0 := time.Now()
			s, err := m.Start(context.Background(), spec)
			if err != nil {
				b.Fatal(err)
			}
			starts = append(starts, time.Since(t0))
			b.StopTimer()
			<-s.Done()
			t1 := time.Now()
			if err := s.Destroy(context.Background()); err != nil {
				b.Fatal(err)
			}
			destroys = append(destroys, time.Since(t1))
			b.StartTimer()
		}
		reportPercentiles(b, starts, "")
		reportPercentiles(b, destroys, "destroy-")
		if base > 0 {
			b.ReportMetric(float64(percentile(starts, 50))/float64(base), "p50-x-baseline")
		}
	})
}

func reportPercentiles(b *testing.B, d []time.Duration, prefix string) {
	b.ReportMetric(float64(percentile(d, 50).Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(percentile(d, 90).Nanoseconds()), prefix+"p90-ns")
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}
