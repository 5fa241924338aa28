package worker

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/function"
)

func TestPlan(t *testing.T) {
	now := time.Now()
	const grace = 30 * time.Second
	ver := func(name string) function.Version {
		return function.Version{Spec: function.Spec{Name: name, MemoryMB: 128}, Version: 1}
	}
	stats := newCallStats()
	for range minRunsToPredict {
		stats.observeDuration(ver("short"), 2*time.Second)
		stats.observeDuration(ver("long"), time.Hour)
	}
	stats.observeDuration(ver("few"), time.Second) // too few runs to predict
	// 1 s + 10 ms per MB, twice, before the grace ends.
	latest := grace - 2*(time.Second+128*10*time.Millisecond)

	call := func(id, fn string, movable bool, ran, left time.Duration) *runningCall {
		return &runningCall{id: id, ver: ver(fn), movable: movable, started: now.Add(-ran), ends: now.Add(left)}
	}
	tests := []struct {
		name     string
		rc       *runningCall
		finish   bool
		why      string
		deadline time.Duration
	}{
		{"forked instance", call("c1", "long", false, time.Second, time.Hour), true, finishUnmovable, 0},
		{"timeout within the grace", call("c2", "long", true, time.Second, 10*time.Second), true, finishEnds, 0},
		{"timeout just too late", call("c3", "long", true, time.Second, latest+time.Millisecond), false, "", 0},
		{"predicted to end", call("c4", "short", true, time.Second, time.Hour), true, finishPredicted, latest},
		{"predicted past its run", call("c5", "short", true, time.Minute, time.Hour), false, "", 0},
		{"too few runs to predict", call("c6", "few", true, 0, time.Hour), false, "", 0},
		{"predicted to run long", call("c7", "long", true, time.Second, 2*time.Hour), false, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := stats.plan([]evictPlan{{rc: tt.rc}}, grace, now)[0]
			if got.finish != tt.finish || got.why != tt.why || got.deadline != tt.deadline {
				t.Errorf("plan = finish %t (%q) deadline %s; want finish %t (%q) deadline %s",
					got.finish, got.why, got.deadline, tt.finish, tt.why, tt.deadline)
			}
		})
	}
}

// Moves go first, smallest memory first; calls let finish last.
func TestPlanOrder(t *testing.T) {
	now := time.Now()
	ver := function.Version{Spec: function.Spec{Name: "f", MemoryMB: 128}, Version: 1}
	mk := func(id string, movable bool, mem uint64) evictPlan {
		return evictPlan{rc: &runningCall{id: id, ver: ver, movable: movable, started: now, ends: now.Add(time.Hour)}, memory: mem}
	}
	plans := newCallStats().plan([]evictPlan{mk("big", true, 300), mk("fork", false, 1), mk("small", true, 100), mk("mid", true, 200)},
		time.Minute, now)
	var got []string
	for _, p := range plans {
		got = append(got, p.rc.id)
	}
	want := []string{"small", "mid", "big", "fork"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}
