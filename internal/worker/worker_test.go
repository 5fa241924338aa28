package worker

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/function"
)

func TestPoolKey(t *testing.T) {
	tests := []struct {
		name    string
		version int
		want    string
	}{
		{"fn", 1, "fn@1"},
		{"fn", 12, "fn@12"},
		{"a-b_c", 0, "a-b_c@0"},
	}
	for _, tt := range tests {
		if got := poolKey(tt.name, tt.version); got != tt.want {
			t.Errorf("poolKey(%q, %d) = %q, want %q", tt.name, tt.version, got, tt.want)
		}
	}
	// Distinct (name, version) pairs never share a key, since '@' is not
	// allowed in names.
	seen := map[string][2]any{}
	for _, name := range []string{"a", "a1", "a@1", "a12", "1"} {
		for v := 0; v < 30; v++ {
			if function.ValidateName(name) != nil {
				continue
			}
			k := poolKey(name, v)
			if prev, dup := seen[k]; dup {
				t.Errorf("poolKey(%q, %d) = poolKey(%v, %v) = %q", name, v, prev[0], prev[1], k)
			}
			seen[k] = [2]any{name, v}
		}
	}
}
