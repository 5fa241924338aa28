package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSnapshotCLI drives the snapshot commands against the real binary:
// doctor, create --use, ls, inspect, export, rm, import, and a call that
// starts from the snapshot (X-Torpor-Start: restore) with its state.
//
// It runs with --templates=false: a snapshot of an instance that served
// calls needs a standalone instance (one forked from a function template
// shares the template's PID namespace; docs/templates.md).
func TestSnapshotCLI(t *testing.T) {
	s := startServer(t, "--idle-ttl", "1s", "--templates=false")
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
	// gc removes data no manifest refers to, once old enough.
	orphan := filepath.Join(s.home, "snapshots", "snapshots", "data", "0123456789abcdef0123456789abcdef")
	if err := os.WriteFile(orphan, []byte("half an upload"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	_ = os.Chtimes(orphan, old, old)
	out, errOut, err = s.cli("snapshot", "gc")
	if err != nil || !strings.Contains(out, "0123456789abcdef") || !strings.Contains(errOut, "removed 1 ") {
		t.Fatalf("gc: %v %q %q", err, out, errOut)
	}
	if _, _, err := s.cli("snapshot", "inspect", short); err != nil {
		t.Fatalf("gc removed a live snapshot: %v", err)
	}
	// A tampered bundle is refused.
	b, _ := os.ReadFile(bundle)
	b[len(b)-100] ^= 1
	bad := bundle + ".bad"
	_ = os.WriteFile(bad, b, 0o600)
	if _, errOut, err := s.cli("snapshot", "import", bad); err == nil || !strings.Contains(errOut, "digest") {
		t.Fatalf("import of a tampered bundle: %v %s", err, errOut)
	}
	// rm dropped the start snapshot: once the restored instance retires
	// (--idle-ttl), the next call is cold again.
	s.waitNoIdle(t)
	if r := s.invoke("counter", "{}"); r.Header.Get("X-Torpor-Start") != "cold" {
		t.Errorf("after rm, start %q, want cold", r.Header.Get("X-Torpor-Start"))
	}
}

// TestSnapshotAcrossProcesses: two torpor processes (separate homes)
// share an external NATS, a snapshot store and a cluster key. A snapshot
// taken by one process's worker is restored by the other's after the first
// is gone.
func TestSnapshotAcrossProcesses(t *testing.T) {
	ns := startNATS(t)
	shared := t.TempDir()
	args := func(id string) []string {
		return []string{"--nats", ns.ClientURL(), "--worker-id", id, "--idle-ttl", "1s",
			"--snapshot-store", filepath.Join(shared, "snapshots"), "--cluster-key-file", filepath.Join(shared, "cluster-key")}
	}
	servers := map[string]*server{"w1": startServer(t, args("w1")...), "w2": startServer(t, args("w2")...)}
	s := servers["w1"]
	s.deploy("counter", "n = 0\ndef handler(event, context):\n    global n\n    n += 1\n    return n\n", deployOpts{})
	mustOK(t, s.invoke("counter", "{}"))
	_, errOut, err := s.cli("snapshot", "create", "counter", "--use")
	if err != nil {
		t.Fatalf("snapshot create: %v\n%s", err, errOut)
	}
	// "counter v1, instance i-… on w2: …": stop the worker that took it.
	var taker string
	for id := range servers {
		if strings.Contains(errOut, " on "+id+":") {
			taker = id
		}
	}
	if taker == "" {
		t.Fatalf("cannot tell which worker took the snapshot from %q", errOut)
	}
	servers[taker].stop()
	other := servers[map[string]string{"w1": "w2", "w2": "w1"}[taker]]
	// Its instances from the deploy and the first call, if any, retire
	// (--idle-ttl).
	other.waitNoIdle(t)
	r := other.invoke("counter", "{}")
	got := mustOK(t, r)
	if r.Header.Get("X-Torpor-Start") != "restore" {
		t.Fatalf("call on the other process started %q (result %s)", r.Header.Get("X-Torpor-Start"), got)
	}
	// The snapshot was taken with n = 1 or 2 (the instance that took the
	// first call, or a new one): the restored copy continues from it.
	if got != "2" && got != "1" {
		t.Errorf("restored counter returned %s", got)
	}
}

// TestSnapshotBadInput: every malformed snapshot request gets a clear 4xx
// naming the problem, and the server keeps serving.
func TestSnapshotBadInput(t *testing.T) {
	s := startServer(t)
	s.deploy("fn", "def handler(e, c):\n    return 1\n", deployOpts{})
	tests := []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/v1/snapshots", `{"function":`, 400, "malformed snapshot request"},
		{"POST", "/v1/snapshots", `{"function":"no-such-fn"}`, 404, "no-such-fn"},
		{"POST", "/v1/snapshots", `{"function":"../etc"}`, 400, "name"},
		{"POST", "/v1/snapshots", `{"function":"fn","instance":"i-000000000000"}`, 404, "not idle"},
		{"GET", "/v1/snapshots/ab", "", 400, "4"},
		{"GET", "/v1/snapshots/zzzz", "", 400, "hex"},
		{"GET", "/v1/snapshots/abcdef12", "", 404, "no snapshot"},
		{"DELETE", "/v1/snapshots/abcdef12", "", 404, "no snapshot"},
		{"GET", "/v1/snapshots/abcdef12/export", "", 404, "no snapshot"},
		{"POST", "/v1/snapshots/import", "PK\x03\x04not a bundle", 400, "not a torpor snapshot bundle"},
		{"POST", "/v1/snapshots/gc?older_than=5s", "", 400, "too short"},
		{"POST", "/v1/snapshots/gc?older_than=soon", "", 400, "duration"},
	}
	for _, tt := range tests {
		r := s.request(tt.method, tt.path, tt.body, nil)
		if r.Status != tt.status || !strings.Contains(r.Body, tt.want) {
			t.Errorf("%s %s %q: %d %s, want %d with %q", tt.method, tt.path, tt.body, r.Status, r.Body, tt.status, tt.want)
		}
	}
	if got := mustOK(t, s.invoke("fn", "{}")); got != "1" {
		t.Errorf("after bad input the function returns %s", got)
	}
}

// waitNoIdle waits until the server's worker has no idle instance (a
// worker that never had one exports no instance gauge at all).
func (s *server) waitNoIdle(t *testing.T) {
	t.Helper()
	eventually(t, 20*time.Second, "idle instances to retire", func() error {
		m := s.get("/metrics", nil).Body
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, `torpor_instances{state="idle"} `) && !strings.HasSuffix(l, " 0") {
				return fmt.Errorf("%s", l)
			}
		}
		return nil
	})
}

// TestSnapshotOfCall: `torpor snapshot create CALL` snapshots the instance
// that served the call, on its worker; a call still running is refused.
// Standalone instances, as in TestSnapshotCLI.
func TestSnapshotOfCall(t *testing.T) {
	s := startServer(t, "--templates=false")
	s.deploy("slow", "import time\nn = 0\ndef handler(event, context):\n    global n\n    n += 1\n    time.sleep(event.get('sleep', 0))\n    return n\n", deployOpts{TimeoutS: 10})
	r := s.invoke("slow", "{}")
	mustOK(t, r)
	call := r.Header.Get("X-Torpor-Call-Id")
	out, errOut, err := s.cli("snapshot", "create", call, "--leave-running")
	if err != nil || !strings.HasPrefix(out, "sha256:") {
		t.Fatalf("snapshot create %s: %v\n%s%s", call, err, out, errOut)
	}
	// The instance kept running and keeps its state.
	if got := mustOK(t, s.invoke("slow", "{}")); got != "2" {
		t.Errorf("after the snapshot the instance returned %s, want 2", got)
	}
	// A running call (async, so that its record says so): 409, saying why.
	var c struct{ ID, Status string }
	if err := json.Unmarshal([]byte(s.post("/v1/functions/slow/invoke?async=true", `{"sleep": 2}`, nil).Body), &c); err != nil {
		t.Fatal(err)
	}
	running := c.ID
	eventually(t, 10*time.Second, "the slow call to run", func() error {
		s.getJSON("/v1/calls/"+running, &c)
		if c.Status != "running" {
			return fmt.Errorf("status %s", c.Status)
		}
		return nil
	})
	r = s.request("POST", "/v1/snapshots", `{"call":"`+running+`"}`, nil)
	if r.Status != 409 || !strings.Contains(r.Body, "still running") {
		t.Errorf("snapshot of a running call: %d %s, want 409", r.Status, r.Body)
	}
	eventually(t, 10*time.Second, "the slow call to finish", func() error {
		s.getJSON("/v1/calls/"+running, &c)
		if c.Status != "succeeded" {
			return fmt.Errorf("status %s", c.Status)
		}
		return nil
	})
}
