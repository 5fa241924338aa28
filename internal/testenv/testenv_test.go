package testenv

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Errorf("Within gave up on a condition that holds on the third poll")
	}
	start := time.Now()
	if Within(30*time.Millisecond, func() bool { return false }) {
		t.Errorf("Within reported a condition that never holds")
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("Within gave up after %s, before its 30ms", d)
	}
}

func TestCtxCancelledAtCleanup(t *testing.T) {
	var ctx interface{ Err() error }
	t.Run("inner", func(t *testing.T) {
		c := Ctx(t)
		if _, ok := c.Deadline(); !ok {
			t.Error("Ctx has no deadline")
		}
		ctx = c
	})
	if ctx.Err() == nil {
		t.Error("Ctx still live after its test ended")
	}
}

func TestBus(t *testing.T) {
	b := Bus(t)
	if b.JS == nil {
		t.Fatal("Bus has no JetStream")
	}
}

func TestPython(t *testing.T) {
	py := Python(t)
	if !filepath.IsAbs(py) {
		t.Errorf("Python() = %q, want an absolute path", py)
	}
	if _, err := os.Stat(py); err != nil {
		t.Errorf("Python() = %q: %v", py, err)
	}
}
