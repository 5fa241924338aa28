package testenv

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/miniosrv"
)

// MinIO starts a MinIO server for t (miniosrv.Binary says which binary) and
// stops it when t ends; without a binary, t is skipped with the reason —
// or, in CI, failed (see needs).
//
// Each call starts its own server rather than sharing one per test binary:
// a start takes ~0.4 s, tests then share no state, and a package-wide
// server would need a TestMain to stop it, which no helper can impose on the
// packages that call it. Tests that need many stores should start one
// server and make a bucket per store.
func MinIO(t testing.TB) *miniosrv.Server {
	t.Helper()
	bin, why := miniosrv.Binary()
	if bin == "" {
		needs(t, why)
	}
	start := time.Now()
	srv, err := miniosrv.Start(Ctx(t), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MinIO up at %s in %s", srv.Endpoint, time.Since(start).Round(time.Millisecond))
	t.Cleanup(srv.Stop)
	return srv
}
