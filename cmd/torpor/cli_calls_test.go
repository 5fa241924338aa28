package main

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/function"
)

func TestCallHops(t *testing.T) {
	ok := function.Attempt{Outcome: function.StatusSucceeded}
	moved := function.Attempt{Outcome: function.OutcomeCheckpointed, Reason: function.ReasonEviction}
	lost := function.Attempt{Outcome: function.OutcomeLost, Reason: function.ReasonCrash}
	tests := []struct {
		name     string
		attempts []function.Attempt
		want     string
	}{
		{"no record of attempts (sync, in flight)", nil, "1"},
		{"one worker", []function.Attempt{ok}, "1"},
		{"moved once", []function.Attempt{moved, ok}, "2 (moved)"},
		{"sliced three times", []function.Attempt{moved, moved, moved, ok}, "4 (moved)"},
		{"run again after a crash", []function.Attempt{lost, ok}, "2 (lost)"},
		{"moved, then its resuming worker died", []function.Attempt{moved, lost, ok}, "3 (1 moved, 1 lost)"},
		{"moved, a restore failed and was retried", []function.Attempt{moved, {Outcome: "retry: restore: no memory"}, ok}, "2 (moved)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := callHops(function.Call{Attempts: tt.attempts}); got != tt.want {
				t.Errorf("callHops = %q, want %q", got, tt.want)
			}
		})
	}
}
