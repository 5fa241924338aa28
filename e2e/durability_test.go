package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// TestAsyncSurvivesSIGKILL: async calls accepted before the whole server is
// killed with SIGKILL all complete after it restarts; none is lost.
func TestAsyncSurvivesSIGKILL(t *testing.T) {
	s := startServer(t, "--async-slots", "1", "--ack-wait", "2s")
	s.deploy("work", "import time\ndef handler(e, c):\n    time.sleep(0.3)\n    return e['i'] * 10\n", deployOpts{})
	const n = 12
	ids := make([]string, n)
	for i := range n {
		r := s.post("/v1/functions/work/invoke?async=true", fmt.Sprintf(`{"i": %d}`, i), nil)
		if r.Status != 202 {
			t.Fatalf("async %d: %d %s", i, r.Status, r.Body)
		}
		var c struct{ ID string }
		_ = json.Unmarshal([]byte(r.Body), &c)
		ids[i] = c.ID
	}
	// Kill while calls are queued and one is running.
	eventually(t, 10*time.Second, "a call to be running", func() error {
		var c struct{ Status string }
		for _, id := range ids {
			s.getJSON("/v1/calls/"+id, &c)
			if c.Status == "running" || c.Status == "succeeded" {
				return nil
			}
		}
		return fmt.Errorf("none running yet")
	})
	s.kill()
	s.start()
	for i, id := range ids {
		var c struct {
			Status   string
			Result   json.RawMessage
			Attempts []struct{ Outcome string }
		}
		eventually(t, 60*time.Second, "call "+id, func() error {
			s.getJSON("/v1/calls/"+id, &c)
			if c.Status != "succeeded" {
				return fmt.Errorf("status %s", c.Status)
			}
			return nil
		})
		if string(c.Result) != fmt.Sprint(i*10) {
			t.Errorf("call %d result %s", i, c.Result)
		}
	}
}

// TestExternalNATS: the same code runs against an external NATS server.
func TestExternalNATS(t *testing.T) {
	ns := startNATS(t)
	s := startServer(t, "--nats", ns.ClientURL())
	s.deploy("ext", "def handler(e, c):\n    return {'ext': e}\n", deployOpts{})
	if got := mustOK(t, s.invoke("ext", `1`)); got != `{"ext": 1}` {
		t.Errorf("sync: %s", got)
	}
	r := s.post("/v1/functions/ext/invoke?async=true", `2`, nil)
	var c struct {
		ID, Status string
		Result     json.RawMessage
	}
	_ = json.Unmarshal([]byte(r.Body), &c)
	eventually(t, 20*time.Second, "async via external NATS", func() error {
		s.getJSON("/v1/calls/"+c.ID, &c)
		if c.Status != "succeeded" {
			return fmt.Errorf("%+v", c)
		}
		return nil
	})
	// The registry lives in the external server: a second torpor sees it.
	s2 := startServer(t, "--nats", ns.ClientURL())
	if got := mustOK(t, s2.invoke("ext", `3`)); got != `{"ext": 3}` {
		t.Errorf("second server: %s", got)
	}
}

// startNATS starts an external NATS JetStream server on loopback for t.
func startNATS(t *testing.T) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), MaxPayload: 8 << 20, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns
}
