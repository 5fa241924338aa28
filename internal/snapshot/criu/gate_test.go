package criu

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"
)

// The gate's script returns at once for every stage but post-dump; at
// post-dump it returns only once the capture has drained, and fails (so
// CRIU fails the dump and lets the process run on) if the capture failed.
func TestPostDumpGate(t *testing.T) {
	tests := []struct {
		name     string
		drainErr error
	}{
		{"captured", nil},
		{"capture failed", errors.New("upload: connection reset")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := newPostDumpGate(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer g.close()
			script := func(action string) *exec.Cmd {
				cmd := exec.Command(g.script)
				cmd.Env = []string{"PATH=/usr/bin:/bin", "CRTOOLS_SCRIPT_ACTION=" + action}
				return cmd
			}
			for _, action := range []string{"pre-dump", "network-lock", "post-resume"} {
				if out, err := script(action).CombinedOutput(); err != nil {
					t.Fatalf("script at %s: %v %s", action, err, out)
				}
			}
			drain := make(chan struct{})
			gateErr := make(chan error, 1)
			go func() {
				gateErr <- g.run(context.Background(), func(ctx context.Context) error {
					<-drain
					return tt.drainErr
				})
			}()
			cmd := script("post-dump")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				t.Fatalf("the post-dump script returned (%v) before the capture drained", err)
			case <-time.After(200 * time.Millisecond):
			}
			close(drain)
			select {
			case err := <-exited:
				if (err == nil) != (tt.drainErr == nil) {
					t.Fatalf("post-dump script: %v, with the capture's error %v", err, tt.drainErr)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the post-dump script still waits after the capture drained")
			}
			if err := <-gateErr; !errors.Is(err, tt.drainErr) || (err == nil) != (tt.drainErr == nil) {
				t.Fatalf("gate: %v, want the capture's error %v", err, tt.drainErr)
			}
		})
	}
}

// A dump that fails before post-dump leaves the gate waiting for a script
// that never comes: close lets it go, before or after it started waiting.
func TestPostDumpGateClose(t *testing.T) {
	for _, closeFirst := range []bool{true, false} {
		g, err := newPostDumpGate(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if closeFirst {
			g.close()
		}
		gateErr := make(chan error, 1)
		go func() {
			gateErr <- g.run(context.Background(), func(context.Context) error {
				t.Error("drained asked for with no dump")
				return nil
			})
		}()
		if !closeFirst {
			time.Sleep(20 * time.Millisecond)
			g.close()
		}
		select {
		case err := <-gateErr:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the gate still waits after close (closed first: %t)", closeFirst)
		}
	}
}
