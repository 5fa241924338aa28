package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func TestLogs(t *testing.T) {
	e := newEnv(t)
	e.commit(t, "quiet")
	e.commit(t, "chatty")
	ctx := testenv.Ctx(t)

	t.Run("no logs returns promptly", func(t *testing.T) {
		start := time.Now()
		n := 0
		err := e.d.Logs(ctx, "quiet", false, func(function.LogLine) error { n++; return nil })
		if err != nil || n != 0 {
			t.Errorf("Logs = %v with %d lines", err, n)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Logs of a function without logs took %s", d)
		}
	})
	t.Run("unknown function", func(t *testing.T) {
		err := e.d.Logs(ctx, "ghost", false, func(function.LogLine) error { return nil })
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Logs(ghost) = %v, want ErrNotFound", err)
		}
	})
	t.Run("invalid name", func(t *testing.T) {
		err := e.d.Logs(ctx, "a>b", true, func(function.LogLine) error { return nil })
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Logs(a>b) = %v, want ErrInvalid", err)
		}
	})

	publish := func(texts ...string) {
		t.Helper()
		var lines []function.LogLine
		for _, s := range texts {
			lines = append(lines, function.LogLine{Function: "chatty", Version: 1, Stream: "stdout", Text: s})
		}
		b, _ := json.Marshal(lines)
		if _, err := e.bus.JS.Publish(ctx, bus.SubjLogs+"chatty", b); err != nil {
			t.Fatal(err)
		}
	}
	publish("one", "two")
	publish("three")
	if _, err := e.bus.JS.Publish(ctx, bus.SubjLogs+"quiet-other", []byte(`[{"text":"not mine"}]`)); err != nil {
		t.Fatal(err)
	}

	t.Run("existing logs in order", func(t *testing.T) {
		var got []string
		err := e.d.Logs(ctx, "chatty", false, func(l function.LogLine) error { got = append(got, l.Text); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != "one,two,three" {
			t.Errorf("lines = %v", got)
		}
	})
	t.Run("callback error stops", func(t *testing.T) {
		stop := errors.New("stop")
		n := 0
		err := e.d.Logs(ctx, "chatty", false, func(function.LogLine) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Errorf("Logs = %v after %d lines, want the callback's error after 1", err, n)
		}
	})
	t.Run("follow", func(t *testing.T) {
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			mu  sync.Mutex
			got []string
		)
		done := make(chan error, 1)
		go func() {
			done <- e.d.Logs(fctx, "chatty", true, func(l function.LogLine) error {
				mu.Lock()
				got = append(got, l.Text)
				mu.Unlock()
				return nil
			})
		}()
		lines := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(got, ",") }
		testenv.Eventually(t, 5*time.Second, "existing lines", func() bool { return lines() == "one,two,three" })
		publish("four")
		testenv.Eventually(t, 5*time.Second, "a line published while following", func() bool { return lines() == "one,two,three,four" })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Logs(follow) after cancel = %v, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Logs(follow) did not return after its context was cancelled")
		}
	})
}

// Each Logs call creates an ordered consumer on TORPOR_LOGS; it should go
// away when Logs returns rather than linger until its inactivity timeout.
func TestLogsReleasesConsumer(t *testing.T) {
	e := newEnv(t)
	e.commit(t, "q")
	ctx := testenv.Ctx(t)
	for i := 0; i < 3; i++ {
		if err := e.d.Logs(ctx, "q", false, func(function.LogLine) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	left := -1
	if testenv.Within(time.Second, func() bool {
		info, err := e.bus.Logs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left = info.State.Consumers
		return left == 0
	}) {
		return
	}
	t.Errorf("Logs left %d consumers on %s after 3 calls", left, bus.StreamLogs)
}
