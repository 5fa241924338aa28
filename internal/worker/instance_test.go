package worker

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/function"
)

func TestCPUShares(t *testing.T) {
	tests := []struct{ mb, want int }{
		{0, 2},
		{1, 2},
		{3, 2},
		{function.MinMemoryMB, 37},
		{function.DefaultMemoryMB, 74},
		{1769, 1024}, // one vCPU
		{3538, 2048},
		{function.MaxMemoryMB, 5927},
	}
	for _, tt := range tests {
		if got := cpuShares(tt.mb); got != tt.want {
			t.Errorf("cpuShares(%d) = %d, want %d", tt.mb, got, tt.want)
		}
	}
	// Monotonic in memory, and never below the kernel's minimum of 2.
	prev := 0
	for mb := function.MinMemoryMB; mb <= function.MaxMemoryMB; mb += 64 {
		s := cpuShares(mb)
		if s < prev || s < 2 || s > 262144 {
			t.Fatalf("cpuShares(%d) = %d (previous %d)", mb, s, prev)
		}
		prev = s
	}
}
