package testenv

import (
	"testing"
	"time"
)

// pollInterval is short enough that a test waits little past the moment
// its condition holds, and long enough not to starve what it waits for.
const pollInterval = 5 * time.Millisecond

// Eventually polls cond until it holds, failing t with what it waited for
// when d passes first. Tests poll with it instead of sleeping a guessed time.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// Within polls cond and reports whether it held before d passed: for tests
// that assert something does not happen, or that handle a timeout themselves.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval)
	}
	return true
}
