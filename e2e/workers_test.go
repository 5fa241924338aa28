package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
)

// TestWorkersCLI drives the worker directory against the real binary: the
// worker reports what it holds (`torpor workers`), answers for its
// processes (`torpor workers inspect`), and stops a function's idle
// instances on request (`torpor workers drop`): the next call starts afresh.
func TestWorkersCLI(t *testing.T) {
	s := startServer(t, "--worker-id", "e2e-worker")
	s.deploy("held", "n = 0\ndef handler(event, context):\n    global n\n    n += 1\n    return n\n", deployOpts{})
	if got := mustOK(t, s.invoke("held", "{}")); got != "1" {
		t.Fatalf("first call = %s", got)
	}
	eventually(t, 10*time.Second, "the directory to show held", func() error {
		var list api.WorkerList
		if code := s.getJSON("/v1/workers", &list); code != 200 {
			return fmt.Errorf("GET /v1/workers: %d", code)
		}
		if len(list.Workers) != 1 || list.Workers[0].ID != "e2e-worker" {
			return fmt.Errorf("workers %+v", list.Workers)
		}
		for _, h := range list.Workers[0].Holdings {
			if h.Function == "held" && h.Idle > 0 {
				return nil
			}
		}
		return fmt.Errorf("e2e-worker holds %+v", list.Workers[0].Holdings)
	})
	out, errOut, err := s.cli("workers")
	if err != nil || !strings.Contains(out, "e2e-worker") || !strings.Contains(out, "RESERVED/BUDGET") {
		t.Fatalf("workers: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err = s.cli("workers", "inspect", "e2e-worker")
	if err != nil || !strings.Contains(out, "worker e2e-worker:") {
		t.Fatalf("workers inspect: %v\n%s%s", err, out, errOut)
	}
	if _, errOut, err = s.cli("workers", "inspect", "nope"); err == nil || !strings.Contains(errOut, `no worker "nope"`) {
		t.Errorf("workers inspect nope: %v\n%s", err, errOut)
	}

	out, errOut, err = s.cli("workers", "drop", "held")
	if err != nil || !strings.Contains(out, "stopped 1 idle instance(s)") || !strings.Contains(out, "on 1 worker(s)") {
		t.Fatalf("workers drop: %v\n%s%s", err, out, errOut)
	}
	// The instance that counted the first call is gone.
	if got := mustOK(t, s.invoke("held", "{}")); got != "1" {
		t.Errorf("call after the drop = %s, want 1 (a new instance)", got)
	}
	if r := s.request("DELETE", "/v1/functions/nope/instances", "", nil); r.Status != 404 {
		t.Errorf("DELETE /v1/functions/nope/instances: %d %s", r.Status, r.Body)
	}
}
