package testenv

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/bus"
)

// Bus starts an embedded NATS JetStream server with its store in a fresh
// temporary directory, so that tests share no state, and closes it when t
// ends.
func Bus(t testing.TB) *bus.Bus {
	t.Helper()
	b, err := bus.Open(Ctx(t), bus.Config{StoreDir: t.TempDir()}, Logger(t))
	if err != nil {
		t.Fatalf("bus.Open: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}
