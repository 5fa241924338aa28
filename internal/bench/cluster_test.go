package bench

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// buildTorpor builds torpor and torpor-init (which sandboxes use, beside
// torpor) into a directory of t and returns the path of torpor. Go's build
// cache makes a second build in one run little more than a link.
func buildTorpor(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if err != nil || root == "." {
		t.Fatalf("find the module root with `go env GOMOD`: %v %s", err, out)
	}
	dir := t.TempDir()
	for _, pkg := range []string{"torpor", "torpor-init"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "./cmd/"+pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "torpor")
}

func TestCluster(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildTorpor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	start := time.Now()
	c, err := StartCluster(ctx, ClusterConfig{Binary: bin, Dir: t.TempDir(), Workers: 2,
		Extra: []string{"--templates=false"}, Log: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			for _, name := range append([]string{"gateway"}, c.Workers()...) {
				t.Logf("the end of %s:\n%s", c.LogFile(name), logTail(c.LogFile(name)))
			}
		}
	})
	t.Logf("cluster up in %s at %s", time.Since(start).Round(time.Millisecond), c.Endpoint())
	if ids := c.Workers(); !slices.Equal(ids, []string{"w1", "w2"}) {
		t.Errorf("Workers() = %v, want [w1 w2]", ids)
	}
	if !strings.HasPrefix(c.Endpoint(), "http://127.0.0.1:") || c.Token() != "" {
		t.Errorf("Endpoint() = %q, Token() = %q; want http://127.0.0.1:PORT and no token", c.Endpoint(), c.Token())
	}

	cli, err := client.New(c.Endpoint(), client.WithHTTPClient(&http.Client{Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	zip, err := codezip.FromFiles(map[string]string{"app.py": "def handler(e, c):\n    return {'n': e.get('n')}\n"})
	if err != nil {
		t.Fatal(err)
	}
	spec := function.Spec{Name: "cluster-echo", Runtime: "python3", Handler: "app.handler", MemoryMB: nopMemoryMB, TimeoutSec: 10}
	if _, err := cli.Deploy(ctx, spec, zip); err != nil {
		t.Fatalf("deploy: %v", err)
	}
	invoke := func(n int) {
		t.Helper()
		res, err := cli.Invoke(ctx, spec.Name, 0, []byte(`{"n":`+strconv.Itoa(n)+`}`))
		if err != nil {
			t.Fatalf("invoke %d: %v", n, err)
		}
		var out struct{ N int }
		if res.FunctionError != nil || json.Unmarshal(res.Payload, &out) != nil || out.N != n {
			t.Fatalf("invoke %d = %s (function error %v), want {\"n\": %d}", n, res.Payload, res.FunctionError, n)
		}
		t.Logf("invoke %d: %s start, call %s", n, res.Start, res.CallID)
	}
	invoke(1)

	if err := c.Signal("w1", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := c.Wait(ctx, "w1"); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait(w1) after SIGKILL = %v, want killed by SIGKILL", err)
	}
	if err := c.Signal("w1", syscall.SIGTERM); err == nil {
		t.Error("Signal to an exited worker succeeded")
	}
	restart := time.Now()
	if err := c.Restart(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("w1 restarted in %s", time.Since(restart).Round(time.Millisecond))
	// GET /v1/workers/w1 asks the worker itself: the new process answers.
	if _, err := cli.Worker(ctx, "w1"); err != nil {
		t.Errorf("GET /v1/workers/w1 after Restart: %v", err)
	}
	if err := c.Restart(ctx, "w9"); err == nil {
		t.Error("Restart(w9) of no such worker succeeded")
	}
	invoke(2)
	invoke(3)

	c.Close()
	for _, id := range c.Workers() {
		if err := c.Wait(ctx, id); err != nil {
			t.Errorf("worker %s after Close: %v, want a clean exit", id, err)
		}
	}
	if err := c.gateway.err; err != nil {
		t.Errorf("gateway after Close: %v, want a clean exit", err)
	}
	t.Logf("whole test in %s", time.Since(start).Round(time.Millisecond))
}

func TestStartClusterInvalid(t *testing.T) {
	tests := []struct {
		name string
		cfg  ClusterConfig
		want string
	}{
		{"no workers", ClusterConfig{Dir: t.TempDir()}, "at least 1"},
		{"no dir", ClusterConfig{Workers: 1}, "ClusterConfig.Dir"},
		{"no binary", ClusterConfig{Workers: 1, Dir: t.TempDir(), Binary: "/nonexistent/torpor"}, "go build"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := StartCluster(context.Background(), tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("StartCluster() = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}
