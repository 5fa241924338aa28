package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

const echoSrc = `
import json, os
def handler(event, context):
    print("got", json.dumps(event))
    return {"event": event, "request_id": context.aws_request_id, "fn": context.function_name,
            "version": context.function_version, "mem": context.memory_limit_in_mb,
            "arn": context.invoked_function_arn, "log_group": context.log_group_name,
            "remaining": context.get_remaining_time_in_millis(), "uid": os.getuid(),
            "env": os.environ.get("GREETING")}
`

// TestDeployInvoke covers the main user path: CLI deploy of a directory,
// invoke through the CLI, REST and the AWS SDK, ls, logs, calls, rm.
func TestDeployInvoke(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte(echoSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := s.cli("deploy", "echo", "--runtime", "python3", "--handler", "app.handler", "--code", dir,
		"--memory", "256", "--timeout", "5", "--env", "GREETING=hello")
	if err != nil {
		t.Fatalf("torpor deploy: %v\n%s%s", err, out, errOut)
	}

	// REST.
	r := s.invoke("echo", `{"a":1}`)
	body := mustOK(t, r)
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got["fn"] != "echo" || got["version"] != "1" || got["mem"] != "256" || got["env"] != "hello" {
		t.Errorf("context/env wrong: %v", got)
	}
	if uid, _ := got["uid"].(float64); uid == 0 {
		t.Errorf("handler ran as root")
	}
	if rem, _ := got["remaining"].(float64); rem <= 0 || rem > 5000 {
		t.Errorf("get_remaining_time_in_millis = %v, want (0, 5000]", rem)
	}
	if got["request_id"] != r.Header.Get("X-Torpor-Call-Id") {
		t.Errorf("aws_request_id %v != call id %s", got["request_id"], r.Header.Get("X-Torpor-Call-Id"))
	}
	if st := r.Header.Get("X-Torpor-Start"); st != "hot" && st != "cold" {
		t.Errorf("X-Torpor-Start = %q", st)
	}
	if !strings.Contains(r.Header.Get("Server-Timing"), "handler;dur=") {
		t.Errorf("Server-Timing = %q", r.Header.Get("Server-Timing"))
	}
	// A second call reuses the instance.
	if r2 := s.invoke("echo", `{}`); r2.Header.Get("X-Torpor-Start") != "hot" {
		t.Errorf("second call start = %q, want hot", r2.Header.Get("X-Torpor-Start"))
	}

	// CLI invoke.
	out, errOut, err = s.cli("invoke", "echo", `{"cli":true}`)
	if err != nil || !strings.Contains(out, `"cli": true`) && !strings.Contains(out, `"cli":true`) {
		t.Errorf("torpor invoke: %v %q %q", err, out, errOut)
	}

	// The AWS SDK, unmodified, pointed at torpor.
	lc := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(s.token, "any-secret", "")})
	ctx := context.Background()
	lo, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{"sdk":1}`),
		LogType: types.LogTypeTail})
	if err != nil {
		t.Fatalf("sdk invoke: %v", err)
	}
	if lo.StatusCode != 200 || lo.FunctionError != nil || !strings.Contains(string(lo.Payload), `"sdk": 1`) {
		t.Errorf("sdk invoke: status %d err %v payload %s", lo.StatusCode, aws.ToString(lo.FunctionError), lo.Payload)
	}
	if aws.ToString(lo.ExecutedVersion) != "1" {
		t.Errorf("ExecutedVersion = %q", aws.ToString(lo.ExecutedVersion))
	}
	if lo.LogResult == nil || *lo.LogResult == "" {
		t.Errorf("no LogResult with LogType Tail")
	}
	ev, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeEvent, Payload: []byte(`{}`)})
	if err != nil || ev.StatusCode != 202 {
		t.Errorf("sdk Event invoke: %v %v", err, ev)
	}
	dr, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeDryRun})
	if err != nil || dr.StatusCode != 204 {
		t.Errorf("sdk DryRun invoke: %v %v", err, dr)
	}
	_, err = lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("nope"), Payload: []byte(`{}`)})
	var rnf *types.ResourceNotFoundException
	if !errors.As(err, &rnf) {
		t.Errorf("sdk invoke of a missing function: %v, want ResourceNotFoundException", err)
	}

	// ls, logs, calls.
	out, _, err = s.cli("ls")
	if err != nil || !strings.Contains(out, "echo") {
		t.Errorf("torpor ls: %v %q", err, out)
	}
	eventually(t, 10*time.Second, "logs", func() error {
		out, _, err := s.cli("logs", "echo")
		if err != nil {
			return err
		}
		if !strings.Contains(out, `got {"a": 1}`) || !strings.Contains(out, "REPORT RequestId") {
			return fmt.Errorf("logs: %q", out)
		}
		return nil
	})
	eventually(t, 10*time.Second, "call records", func() error {
		out, _, err := s.cli("calls", "echo")
		if err != nil {
			return err
		}
		if !strings.Contains(out, r.Header.Get("X-Torpor-Call-Id")) {
			return fmt.Errorf("calls: %q", out)
		}
		return nil
	})
	// Metrics.
	if r := s.get("/metrics", nil); r.Status != 200 || !strings.Contains(r.Body, `torpor_calls_total{function="echo"`) {
		t.Fatalf("metrics: %d %s", r.Status, tail(r.Body, 500))
	}

	// rm.
	if _, errOut, err := s.cli("rm", "echo"); err != nil {
		t.Fatalf("torpor rm: %v %s", err, errOut)
	}
	if r := s.invoke("echo", `{}`); r.Status != 404 {
		t.Errorf("invoke after rm: %d %s", r.Status, r.Body)
	}
}

// TestVersions: deploying again creates a new version; calls in flight finish
// on the version they started with.
func TestVersions(t *testing.T) {
	s := startServer(t)
	s.deploy("ver", "import time\ndef handler(e, c):\n    time.sleep(e.get('sleep', 0))\n    return 'v1'\n", deployOpts{TimeoutS: 10})
	var wg sync.WaitGroup
	var slow invokeResp
	wg.Add(1)
	go func() { defer wg.Done(); slow = s.invoke("ver", `{"sleep": 2}`) }()
	s.waitBusy(t, 1)
	s.deploy("ver", "def handler(e, c):\n    return 'v2'\n", deployOpts{})
	if got := mustOK(t, s.invoke("ver", `{}`)); got != `"v2"` {
		t.Errorf("after redeploy got %s, want v2", got)
	}
	wg.Wait()
	if got := mustOK(t, slow); got != `"v1"` || slow.Header.Get("X-Torpor-Version") != "1" {
		t.Errorf("in-flight call got %s (version %s), want v1", got, slow.Header.Get("X-Torpor-Version"))
	}
	var v struct{ Version int }
	if s.getJSON("/v1/functions/ver", &v); v.Version != 2 {
		t.Errorf("latest version %d, want 2", v.Version)
	}
	// An old version can still be invoked explicitly.
	if got := mustOK(t, s.post("/v1/functions/ver/invoke?version=1", `{}`, nil)); got != `"v1"` {
		t.Errorf("version=1 got %s", got)
	}
}

// TestAsync: an accepted async call runs and its result is kept.
func TestAsync(t *testing.T) {
	s := startServer(t)
	s.deploy("sq", "def handler(e, c):\n    if e.get('fail'): raise ValueError('bad input')\n    return e['n'] * e['n']\n", deployOpts{})
	r := s.post("/v1/functions/sq/invoke?async=true", `{"n": 7}`, nil)
	if r.Status != 202 {
		t.Fatalf("async invoke: %d %s", r.Status, r.Body)
	}
	var c struct {
		ID     string          `json:"id"`
		Status string          `json:"status"`
		Result json.RawMessage `json:"result"`
		Error  *struct{ ErrorType string }
	}
	if err := json.Unmarshal([]byte(r.Body), &c); err != nil || c.ID == "" {
		t.Fatalf("async answer %q: %v", r.Body, err)
	}
	eventually(t, 20*time.Second, "async result", func() error {
		s.getJSON("/v1/calls/"+c.ID, &c)
		if c.Status != "succeeded" || string(c.Result) != "49" {
			return fmt.Errorf("call %+v", c)
		}
		return nil
	})
	r = s.post("/v1/functions/sq/invoke?async=true", `{"fail": true}`, nil)
	_ = json.Unmarshal([]byte(r.Body), &c)
	eventually(t, 20*time.Second, "async error", func() error {
		s.getJSON("/v1/calls/"+c.ID, &c)
		if c.Status != "failed" || c.Error == nil || c.Error.ErrorType != "ValueError" {
			return fmt.Errorf("call %+v", c)
		}
		return nil
	})
}

// TestConcurrencyLimit: a function deployed with --concurrency 1 runs one call
// at a time; a sync call that cannot get a slot in time is throttled (429,
// TooManyRequestsException on the Lambda route), while async calls wait.
func TestConcurrencyLimit(t *testing.T) {
	s := startServer(t)
	s.deploy("one", "import time\ndef handler(e, c):\n    time.sleep(e)\n    return 'ok'\n", deployOpts{Concurrency: 1, TimeoutS: 10})
	var wg sync.WaitGroup
	wg.Add(1)
	var first invokeResp
	go func() { defer wg.Done(); first = s.invoke("one", `3`) }()
	s.waitBusy(t, 1)
	r := s.invoke("one", `0`)
	if r.Status != 429 {
		t.Errorf("second parallel call: %d %s, want 429", r.Status, r.Body)
	}
	r = s.post("/2015-03-31/functions/one/invocations", `0`, nil)
	if r.Status != 429 || r.Header.Get("X-Amzn-ErrorType") != "TooManyRequestsException" {
		t.Errorf("Lambda route: %d %v", r.Status, r.Header.Get("X-Amzn-ErrorType"))
	}
	a := s.post("/v1/functions/one/invoke?async=true", `0`, nil)
	wg.Wait()
	mustOK(t, first)
	var c struct{ ID, Status string }
	_ = json.Unmarshal([]byte(a.Body), &c)
	eventually(t, 20*time.Second, "queued async call", func() error {
		s.getJSON("/v1/calls/"+c.ID, &c)
		if c.Status != "succeeded" {
			return fmt.Errorf("%+v", c)
		}
		return nil
	})
}

// TestMemoryBudget: a worker never starts instances whose memory limits add
// up to more than its budget. Idle instances make room; when every instance
// is busy, a sync call is throttled; a function bigger than the budget is
// refused at deploy.
func TestMemoryBudget(t *testing.T) {
	s := startServer(t, "--memory-budget", "256")
	src := "import time\ndef handler(e, c):\n    time.sleep(e)\n    return 'ok'\n"
	for _, fn := range []string{"a", "b", "c"} {
		s.deploy(fn, src, deployOpts{MemoryMB: 128, TimeoutS: 10})
	}
	for _, fn := range []string{"a", "b", "c", "a"} {
		mustOK(t, s.invoke(fn, `0`))
	}
	var wg sync.WaitGroup
	for _, fn := range []string{"a", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); mustOK(t, s.invoke(fn, `3`)) }()
	}
	s.waitBusy(t, 2) // both calls hold instances: no idle one left to evict
	if r := s.invoke("c", `0`); r.Status != 429 || !strings.Contains(r.Body, "memory budget") {
		t.Errorf("call while the budget is all busy: %d %s", r.Status, r.Body)
	}
	wg.Wait()
	mustOK(t, s.invoke("c", `0`))
	code, body := s.deployZip("big", zipFiles(t, map[string]string{"app.py": src}), deployOpts{MemoryMB: 512})
	if code != 400 || !strings.Contains(body, "memory budget") {
		t.Errorf("deploy above the budget: %d %s", code, body)
	}
}

// TestGracefulShutdown: SIGTERM lets running calls finish before the server
// exits, and the server exits cleanly.
func TestGracefulShutdown(t *testing.T) {
	s := startServer(t)
	s.deploy("slow", "import time\ndef handler(e, c):\n    time.sleep(e)\n    return 'finished'\n", deployOpts{TimeoutS: 10})
	done := make(chan invokeResp, 1)
	go func() { done <- s.invoke("slow", `2`) }()
	s.waitBusy(t, 1)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := mustOK(t, <-done); got != `"finished"` {
		t.Errorf("call running at SIGTERM: %s", got)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM\n%s", code, tail(s.out.String(), 3000))
	}
}

// waitBusy waits until the worker has no idle instance and at least live
// live ones: the calls just started are running, not merely sent.
func (s *server) waitBusy(t *testing.T, live int) {
	t.Helper()
	eventually(t, 20*time.Second, "calls to be running", func() error {
		m := s.get("/metrics", nil).Body
		if !strings.Contains(m, `torpor_instances{state="idle"} 0`) || !strings.Contains(m, fmt.Sprintf(`torpor_instances{state="live"} %d`, live)) {
			return fmt.Errorf("instances: %s", grepLines(m, "torpor_instances{"))
		}
		return nil
	})
}

// grepLines returns the lines of text that contain sub.
func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}
