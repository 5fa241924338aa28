// Package testenv holds helpers shared by torpor's tests; never imported by
// non-test code. It owns the test-wide conventions (a deadline on every
// test's context, polling instead of sleeping, an embedded bus per test, the
// real Python interpreter, and CI never skipping) so that each package's
// tests do not grow their own copies. It must not import any package whose
// in-package tests use it: internal/bus's own tests, for one, cannot (the
// criu package's tests are an external package for this reason).
package testenv

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
)

// Ctx returns a context that ends after 30 s, so that a hung call fails its
// test instead of the whole run, and is cancelled when t ends.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Logger returns a logger for code under test: silent by default, since
// most tests only look at results, or writing through t.Log at debug level
// when TORPOR_TEST_LOG is set, to see what a failing test's components did.
func Logger(t testing.TB) *slog.Logger {
	if os.Getenv("TORPOR_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// tWriter sends each record the text handler writes to t.Log, so that it
// shows beside the test that produced it.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
