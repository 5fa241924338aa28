package sandbox

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestAwaitReport: the status a template reports wins; without one, a
// process that is gone is taken as killed within a few seconds.
func TestAwaitReport(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report bool
		want   syscall.WaitStatus
	}{
		{"reported", true, syscall.WaitStatus(3 << 8)}, // exit status 3
		{"report lost", false, syscall.WaitStatus(syscall.SIGKILL)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			proc, err := os.FindProcess(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			exited := make(chan syscall.WaitStatus, 1)
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // reaped here, as a template would
			if tc.report {
				exited <- tc.want
			}
			start := time.Now()
			ws, err := awaitReport(proc, exited)
			if err != nil || ws != tc.want {
				t.Fatalf("awaitReport = %v, %v; want %v", ws, err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}
