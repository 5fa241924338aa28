package dispatch

import "testing"

func TestChoose(t *testing.T) {
	tests := []struct {
		name  string
		cands []candidate
		want  string
	}{
		{"nobody holds it", nil, ""},
		{"only a worker with nothing spare", []candidate{{Worker: "a", Idle: 1, Inflight: 1}}, ""},
		{"the one with idle instances", []candidate{{Worker: "a", Idle: 1}}, "a"},
		{"most idle first", []candidate{{Worker: "a", Idle: 1}, {Worker: "b", Idle: 3}, {Worker: "c", Idle: 2}}, "b"},
		{"idle beats a template", []candidate{{Worker: "a", Template: true}, {Worker: "b", Idle: 1, Running: 9}}, "b"},
		{"equal idle: fewest running", []candidate{{Worker: "a", Idle: 2, Running: 5}, {Worker: "b", Idle: 2, Running: 1}}, "b"},
		{"equal idle and running: smaller id", []candidate{{Worker: "b", Idle: 2}, {Worker: "a", Idle: 2}}, "a"},
		{"calls in flight claim idle instances", []candidate{{Worker: "a", Idle: 3, Inflight: 2}, {Worker: "b", Idle: 2}}, "b"},
		{"in flight counts as running for ties", []candidate{{Worker: "a", Idle: 3, Inflight: 1}, {Worker: "b", Idle: 2, Running: 2}}, "a"},
		{"all idle claimed: a template", []candidate{{Worker: "a", Idle: 1, Inflight: 1}, {Worker: "b", Template: true}}, "b"},
		{"idle claimed, its own template", []candidate{{Worker: "a", Idle: 1, Inflight: 1, Template: true}}, "a"},
		{"templates: fewest running", []candidate{{Worker: "a", Template: true, Running: 3}, {Worker: "b", Template: true, Running: 1}}, "b"},
		{"templates: in flight counts", []candidate{{Worker: "a", Template: true, Inflight: 2}, {Worker: "b", Template: true, Running: 1}}, "b"},
		{"templates: smaller id on a tie", []candidate{{Worker: "c", Template: true}, {Worker: "a", Template: true}}, "a"},
		{"a stale negative spare is none", []candidate{{Worker: "a", Idle: 0, Inflight: 2}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := choose(tt.cands); got != tt.want {
				t.Errorf("choose(%+v) = %q, want %q", tt.cands, got, tt.want)
			}
		})
	}
}
