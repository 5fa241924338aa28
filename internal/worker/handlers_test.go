package worker

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/function"
)

func TestFinish(t *testing.T) {
	started := time.Now().UTC().Add(-time.Second)
	earlier := started.Add(-time.Minute)
	okRes := function.InvokeResult{Payload: []byte(`{"r":1}`), Start: function.StartHot, Duration: 1500 * time.Microsecond}
	failRes := function.InvokeResult{Err: &function.Error{ErrorType: "E", ErrorMessage: "m"}, Start: function.StartCold,
		Duration: 2 * time.Millisecond}

	tests := []struct {
		name         string
		call         function.Call
		res          function.InvokeResult
		wantStatus   string
		wantAttempts []function.Attempt // FinishedAt checked separately (non-zero)
	}{
		{
			name: "first attempt appended", call: function.Call{}, res: okRes, wantStatus: function.StatusSucceeded,
			wantAttempts: []function.Attempt{{Worker: "w1", Start: function.StartHot, StartedAt: started, Outcome: "succeeded"}},
		},
		{
			name: "running attempt of this worker completed",
			call: function.Call{Status: function.StatusRunning, Attempts: []function.Attempt{{Worker: "w1", StartedAt: earlier}}},
			res:  failRes, wantStatus: function.StatusFailed,
			wantAttempts: []function.Attempt{{Worker: "w1", Start: function.StartCold, StartedAt: earlier, Outcome: "failed"}},
		},
		{
			name: "running attempt of another worker left alone",
			call: function.Call{Attempts: []function.Attempt{{Worker: "w0", StartedAt: earlier}}},
			res:  okRes, wantStatus: function.StatusSucceeded,
			wantAttempts: []function.Attempt{{Worker: "w0", StartedAt: earlier},
				{Worker: "w1", Start: function.StartHot, StartedAt: started, Outcome: "succeeded"}},
		},
		{
			name: "finished attempt of this worker kept, new one appended",
			call: function.Call{Attempts: []function.Attempt{{Worker: "w1", StartedAt: earlier, FinishedAt: earlier.Add(time.Second),
				Outcome: "retry: no instance"}}},
			res: okRes, wantStatus: function.StatusSucceeded,
			wantAttempts: []function.Attempt{{Worker: "w1", StartedAt: earlier, Outcome: "retry: no instance"},
				{Worker: "w1", Start: function.StartHot, StartedAt: started, Outcome: "succeeded"}},
		},
		{
			name: "lost attempt then ours",
			call: function.Call{Attempts: []function.Attempt{{Worker: "w0", StartedAt: earlier, Outcome: "lost"},
				{Worker: "w1", StartedAt: started}}},
			res: okRes, wantStatus: function.StatusSucceeded,
			wantAttempts: []function.Attempt{{Worker: "w0", StartedAt: earlier, Outcome: "lost"},
				{Worker: "w1", Start: function.StartHot, StartedAt: started, Outcome: "succeeded"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.call
			before := time.Now().UTC()
			finish(&c, tt.res, "w1", started)
			if c.Status != tt.wantStatus {
				t.Errorf("Status = %q, want %q", c.Status, tt.wantStatus)
			}
			if c.FinishedAt.Before(before) {
				t.Errorf("FinishedAt = %v, want now", c.FinishedAt)
			}
			if c.DurationMS != float64(tt.res.Duration.Microseconds())/1000 {
				t.Errorf("DurationMS = %v", c.DurationMS)
			}
			if len(c.Attempts) != len(tt.wantAttempts) {
				t.Fatalf("attempts = %+v, want %+v", c.Attempts, tt.wantAttempts)
			}
			for i, w := range tt.wantAttempts {
				a := c.Attempts[i]
				if a.Worker != w.Worker || a.Start != w.Start || !a.StartedAt.Equal(w.StartedAt) || a.Outcome != w.Outcome {
					t.Errorf("attempt %d = %+v, want %+v", i, a, w)
				}
				if a.Worker == "w1" && a.Outcome == tt.wantStatus && !a.FinishedAt.Equal(c.FinishedAt) {
					t.Errorf("attempt %d FinishedAt = %v, want the call's %v", i, a.FinishedAt, c.FinishedAt)
				}
			}
			if tt.res.Err != nil {
				if c.Error != tt.res.Err || c.Result != nil {
					t.Errorf("failed call: Error = %+v, Result = %s", c.Error, c.Result)
				}
			} else if c.Error != nil || string(c.Result) != string(tt.res.Payload) {
				t.Errorf("succeeded call: Error = %+v, Result = %s", c.Error, c.Result)
			}
		})
	}
}

// A result replaces whatever outcome the record held before.
func TestFinishOverwritesStaleOutcome(t *testing.T) {
	c := function.Call{Error: &function.Error{ErrorType: "Old"}}
	finish(&c, function.InvokeResult{Payload: []byte(`1`)}, "w", time.Now())
	if c.Error != nil || string(c.Result) != "1" {
		t.Errorf("after success: %+v", c)
	}
	finish(&c, function.InvokeResult{Err: &function.Error{ErrorType: "New"}}, "w", time.Now())
	if c.Result != nil || c.Error == nil || c.Error.ErrorType != "New" {
		t.Errorf("after failure: %+v", c)
	}
	// The record still encodes (it is stored as JSON).
	if _, err := json.Marshal(c); err != nil {
		t.Error(err)
	}
}
