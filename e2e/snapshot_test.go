package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSnapshotCLI drives the snapshot commands against the real binary:
// doctor, create --use, ls, inspect, export, rm, import, and a call that
// starts from the snapshot (X-Torpor-Start: restore) with its state.
func TestSnapshotCLI(t *testing.T) {
	s := startServer(t, "--idle-ttl", "1s")
	out, errOut, err := s.cli("doctor", "--home", s.home)
	if err != nil {
		t.Fatalf("doctor: %v\n%s%s", err, out, errOut)
	}
	for _, want := range []string{"criu 4.", "criu check       passes", "snapshot store"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	s.deploy("counter", "n = 0\ndef handler(event, context):\n    global n\n    n += 1\n    return n\n", deployOpts{})
	if got := mustOK(t, s.invoke("counter", "{}")); got != "1" {
		t.Fatalf("first call = %s", got)
	}
	out, errOut, err = s.cli("snapshot", "create", "counter", "--use")
	if err != nil {
		t.Fatalf("snapshot create: %v\n%s", err, errOut)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "sha256:") || !strings.Contains(errOut, "new instances start from it") {
		t.Fatalf("snapshot create printed %q / %q", out, errOut)
	}
	short := id[7:19]
	out, _, err = s.cli("snapshot", "ls")
	if err != nil || !strings.Contains(out, short) || !strings.Contains(out, "counter@1") {
		t.Fatalf("snapshot ls: %v\n%s", err, out)
	}
	out, _, err = s.cli("snapshot", "inspect", short)
	if err != nil || !strings.Contains(out, `"pages-1.img"`) || !strings.Contains(out, id) {
		t.Fatalf("snapshot inspect: %v\n%s", err, out)
	}
	// The checkpointed instance is gone (not left running): the next call
	// is restored from the snapshot and continues its count.
	r := s.invoke("counter", "{}")
	if got := mustOK(t, r); got != "2" || r.Header.Get("X-Torpor-Start") != "restore" {
		t.Fatalf("call after snapshot: %s, start %q", got, r.Header.Get("X-Torpor-Start"))
	}

	bundle := filepath.Join(t.TempDir(), "counter.snap")
	if _, errOut, err := s.cli("snapshot", "export", short, bundle); err != nil {
		t.Fatalf("export: %v\n%s", err, errOut)
	}
	if _, _, err := s.cli("snapshot", "rm", short); err != nil {
		t.Fatalf("rm: %v", err)
	}
	if _, errOut, err := s.cli("snapshot", "inspect", short); err == nil || !strings.Contains(errOut, "no snapshot id starts with") {
		t.Fatalf("inspect after rm: %v %s", err, errOut)
	}
	out, errOut, err = s.cli("snapshot", "import", bundle)
	if err != nil || !strings.HasPrefix(out, id) {
		t.Fatalf("import: %v\n%s%s", err, out, errOut)
	}
	// A tampered bundle is refused.
	b, _ := os.ReadFile(bundle)
	b[len(b)-100] ^= 1
	bad := bundle + ".bad"
	_ = os.WriteFile(bad, b, 0o600)
	if _, errOut, err := s.cli("snapshot", "import", bad); err == nil || !strings.Contains(errOut, "digest") {
		t.Fatalf("import of a tampered bundle: %v %s", err, errOut)
	}
	// rm dropped the start snapshot: wait out the idle TTL, then it is cold again.
	time.Sleep(2500 * time.Millisecond)
	if r := s.invoke("counter", "{}"); r.Header.Get("X-Torpor-Start") != "cold" {
		t.Errorf("after rm, start %q, want cold", r.Header.Get("X-Torpor-Start"))
	}
}
