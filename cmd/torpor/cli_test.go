package main

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// cliEnv is a gateway over a fake backend and a way to run the CLI at it.
type cliEnv struct {
	url string
	b   *gatewaytest.Backend
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	b := gatewaytest.NewBackend()
	ts := httptest.NewServer(gateway.New(b, gateway.Options{}))
	t.Cleanup(ts.Close)
	return &cliEnv{url: ts.URL, b: b}
}

// result is what one CLI run produced.
type result struct {
	code           int
	stdout, stderr string
}

// run runs "torpor --endpoint URL args..." in-process.
func (e *cliEnv) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, newRootCmd(), append([]string{"--endpoint", e.url}, args...), strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func (r result) want(t *testing.T, code int, stdoutPart, stderrPart string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d (stdout %q, stderr %q)", r.code, code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, stdoutPart) {
		t.Errorf("stdout %q lacks %q", r.stdout, stdoutPart)
	}
	if !strings.Contains(r.stderr, stderrPart) {
		t.Errorf("stderr %q lacks %q", r.stderr, stderrPart)
	}
}

// codeDir writes a tiny Python function into a temp dir.
func codeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte("def handler(event, context):\n    return event\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", "util.py"), []byte("X = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// zipNames lists the entries of a zip.
func zipNames(t *testing.T, z []byte) []string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	return names
}

func TestDeploy(t *testing.T) {
	e := newCLIEnv(t)
	dir := codeDir(t)

	r := e.run(t, "", "deploy", "hello", "--handler", "app.handler", "--code", dir,
		"--memory", "256", "--timeout", "2.5", "--env", "GREETING=hi=there", "--env", "EMPTY=", "--concurrency", "3")
	r.want(t, 0, "deployed hello version 1 (python3 app.handler, 256 MB, 2.5s; code ", "")
	v := e.b.Fns["hello"][0]
	if v.MemoryMB != 256 || v.TimeoutSec != 2.5 || v.Concurrency != 3 || v.Env["GREETING"] != "hi=there" || v.Env["EMPTY"] != "" || len(v.Env) != 2 {
		t.Errorf("deployed spec %+v", v.Spec)
	}

	// The uploaded code is the directory, zipped the way codezip does it.
	want, err := codezip.ZipDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v.CodeSize != int64(len(want)) {
		t.Errorf("uploaded %d bytes, want %d", v.CodeSize, len(want))
	}
	if got := strings.Join(zipNames(t, want), " "); got != "app.py lib/ lib/util.py" {
		t.Errorf("zip entries %q", got)
	}

	// A .zip file is uploaded as is.
	zipPath := filepath.Join(t.TempDir(), "code.zip")
	os.WriteFile(zipPath, want, 0o644)
	e.run(t, "", "deploy", "hello", "--handler", "app.handler", "--code", zipPath).want(t, 0, "deployed hello version 2", "")
	if got := e.b.Fns["hello"][1]; got.CodeSize != int64(len(want)) || got.MemoryMB != function.DefaultMemoryMB || got.MaxDurationSec != 0 {
		t.Errorf("second version %+v", got)
	}

	// Calls that run in slices.
	e.run(t, "", "deploy", "hello", "--handler", "app.handler", "--code", dir, "--timeout", "60", "--max-duration", "3600").
		want(t, 0, "deployed hello version 3 (python3 app.handler, 128 MB, 60s (max 3600s); code ", "")
	if got := e.b.Fns["hello"][2]; got.TimeoutSec != 60 || got.MaxDurationSec != 3600 || got.MaxDuration() != time.Hour {
		t.Errorf("sliced version %+v", got.Spec)
	}
	r = e.run(t, "", "ls")
	if !strings.Contains(r.stdout, "60s (max 3600s)") {
		t.Errorf("ls does not show the max duration:\n%s", r.stdout)
	}
}

func TestDeployErrors(t *testing.T) {
	e := newCLIEnv(t)
	dir := codeDir(t)
	escaping := codeDir(t)
	os.Symlink("../../etc/passwd", filepath.Join(escaping, "secrets"))
	notZip := filepath.Join(t.TempDir(), "code.zip")
	os.WriteFile(notZip, []byte("not a zip"), 0o644)

	tests := []struct {
		name       string
		args       []string
		code       int
		stderrPart string
	}{
		{"no name", []string{"deploy", "--handler", "app.handler", "--code", dir}, exitUsage, "deploy needs NAME"},
		{"no handler", []string{"deploy", "f", "--code", dir}, exitUsage, "needs --handler and --code"},
		{"no code", []string{"deploy", "f", "--handler", "app.handler"}, exitUsage, "needs --handler and --code"},
		{"unknown flag", []string{"deploy", "f", "--handler", "app.handler", "--code", dir, "--mem", "3"}, exitUsage, "unknown flag: --mem"},
		{"bad env", []string{"deploy", "f", "--handler", "app.handler", "--code", dir, "--env", "NOVALUE"}, exitUsage, `invalid --env "NOVALUE"`},
		{"bad name", []string{"deploy", "f.g", "--handler", "app.handler", "--code", dir}, exitError, "[A-Za-z0-9_-]"},
		{"bad handler", []string{"deploy", "f", "--handler", "handler", "--code", dir}, exitError, "MODULE.FUNCTION"},
		{"bad memory", []string{"deploy", "f", "--handler", "app.handler", "--code", dir, "--memory", "1"}, exitError, "memory 1 MB out of range"},
		{"max duration under the timeout", []string{"deploy", "f", "--handler", "app.handler", "--code", dir, "--timeout", "10", "--max-duration", "5"},
			exitError, "max duration 5s out of range"},
		{"max duration over a day", []string{"deploy", "f", "--handler", "app.handler", "--code", dir, "--max-duration", "86401"},
			exitError, "max duration 86401s out of range"},
		{"missing code", []string{"deploy", "f", "--handler", "app.handler", "--code", filepath.Join(dir, "nope")}, exitError, "no such file"},
		{"escaping symlink", []string{"deploy", "f", "--handler", "app.handler", "--code", escaping}, exitError, "secrets -> ../../etc/passwd is pointing outside"},
		{"not a zip", []string{"deploy", "f", "--handler", "app.handler", "--code", notZip}, exitError, "not a valid zip archive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(t, "", tc.args...)
			r.want(t, tc.code, "", tc.stderrPart)
			if !strings.HasPrefix(r.stderr, "torpor: ") {
				t.Errorf("stderr %q does not start with torpor:", r.stderr)
			}
		})
	}
	if len(e.b.Fns) != 0 {
		t.Errorf("a bad deploy reached the backend")
	}
}

func TestInvoke(t *testing.T) {
	e := newCLIEnv(t)
	e.run(t, "", "deploy", "echo", "--handler", "app.handler", "--code", codeDir(t)).want(t, 0, "deployed", "")
	e.run(t, "", "deploy", "echo", "--handler", "app.handler", "--code", codeDir(t)).want(t, 0, "version 2", "")

	tests := []struct {
		name       string
		stdin      string
		args       []string
		code       int
		stdout     string // exact
		stderrPart string
	}{
		{"json arg", "", []string{"invoke", "echo", `{"a":1}`}, 0, "{\"echo\":{\"a\":1}}\n", ""},
		{"no event", "", []string{"invoke", "echo"}, 0, "{\"echo\":{}}\n", ""},
		{"stdin", `{"from":"stdin"}`, []string{"invoke", "echo", "-"}, 0, "{\"echo\":{\"from\":\"stdin\"}}\n", ""},
		{"version", "", []string{"invoke", "echo", "1", "--version", "1"}, 0, "{\"echo\":1}\n", ""},
		{"verbose", "", []string{"invoke", "-v", "echo"}, 0, "{\"echo\":{}}\n", "version 2, warm start in 1.5ms, handler 12ms"},
		{"function error", "", []string{"invoke", "echo", `{"raise":"ValueError"}`}, exitError, "", `"errorType":"ValueError"`},
		{"bad json", "", []string{"invoke", "echo", `{"a":`}, exitError, "", "torpor: invalid JSON event: unexpected end of JSON input"},
		{"unknown function", "", []string{"invoke", "ghost"}, exitError, "", `torpor: function "ghost": not found`},
		{"too many args", "", []string{"invoke", "echo", "{}", "extra"}, exitUsage, "", "at most 2 argument(s)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(t, tc.stdin, tc.args...)
			r.want(t, tc.code, tc.stdout, tc.stderrPart)
			if r.stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", r.stdout, tc.stdout)
			}
		})
	}
	if v := e.b.LastInvoke().Version; v != 0 {
		t.Errorf("last call version %d", v)
	}

	// --async prints the call id; call ID prints its record.
	r := e.run(t, "", "invoke", "echo", "--async", `{"later":true}`)
	r.want(t, 0, "call-", "")
	id := strings.TrimSpace(r.stdout)
	r = e.run(t, "", "call", id)
	r.want(t, 0, `"status": "queued"`, "")
	var c function.Call
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.ID != id || c.Mode != "async" {
		t.Errorf("call %q: %+v %v", r.stdout, c, err)
	}
	e.run(t, "", "call", "nope").want(t, exitError, "", `call "nope": not found`)
}

func TestLsRmCallsLogs(t *testing.T) {
	e := newCLIEnv(t)
	e.run(t, "", "ls").want(t, 0, "", "no functions")
	e.run(t, "", "deploy", "alpha", "--handler", "app.handler", "--code", codeDir(t), "--concurrency", "2").want(t, 0, "deployed", "")
	e.run(t, "", "deploy", "beta", "--handler", "app.main", "--code", codeDir(t), "--memory", "512").want(t, 0, "deployed", "")

	r := e.run(t, "", "ls")
	r.want(t, 0, "NAME", "")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "alpha") || !strings.Contains(lines[2], "app.main") || !strings.Contains(lines[2], "512 MB") {
		t.Errorf("ls:\n%s", r.stdout)
	}

	e.run(t, "", "invoke", "alpha").want(t, 0, "echo", "")
	e.run(t, "", "invoke", "alpha", `{"raise":"KeyError"}`).want(t, exitError, "", "KeyError")
	r = e.run(t, "", "calls", "alpha", "--limit", "5")
	r.want(t, 0, "ID", "")
	if !strings.Contains(r.stdout, "call-1") || !strings.Contains(r.stdout, "call-2") || !strings.Contains(r.stdout, "KeyError") {
		t.Errorf("calls:\n%s", r.stdout)
	}
	e.run(t, "", "calls", "alpha", "--limit", "0").want(t, exitUsage, "", "invalid --limit 0")

	e.b.LogLines["alpha"] = []function.LogLine{
		{Time: time.Date(2025, 3, 4, 5, 6, 7, 8_000_000, time.UTC), Function: "alpha", CallID: "call-1", Stream: "stdout", Text: "hello"},
		{Time: time.Date(2025, 3, 4, 5, 6, 8, 0, time.UTC), Function: "alpha", Stream: "platform", Text: "START"},
	}
	e.run(t, "", "logs", "alpha").want(t, 0, "2025-03-04T05:06:07.008Z [call-1] hello\n2025-03-04T05:06:08.000Z START\n", "")
	e.run(t, "", "logs", "ghost").want(t, exitError, "", "not found")

	e.run(t, "", "rm", "alpha").want(t, 0, "deleted alpha", "")
	e.run(t, "", "rm", "alpha").want(t, exitError, "", `function "alpha": not found`)
	r = e.run(t, "", "ls")
	if strings.Contains(r.stdout, "alpha") || !strings.Contains(r.stdout, "beta") {
		t.Errorf("ls after rm:\n%s", r.stdout)
	}
}

func TestUnreachable(t *testing.T) {
	ts := httptest.NewServer(nil)
	e := &cliEnv{url: ts.URL}
	ts.Close()
	r := e.run(t, "", "ls")
	r.want(t, exitError, "", "torpor: cannot reach torpor at "+ts.URL+": is `torpor up` running? (dial tcp")
}

func TestEndpointFlag(t *testing.T) {
	t.Setenv("TORPOR_ENDPOINT", "http://torpor.example:9999")
	root := newRootCmd()
	if got := root.PersistentFlags().Lookup("endpoint").DefValue; got != "http://torpor.example:9999" {
		t.Errorf("default endpoint %q", got)
	}
	t.Setenv("TORPOR_ENDPOINT", "")
	if got := newRootCmd().PersistentFlags().Lookup("endpoint").DefValue; got != defaultEndpoint {
		t.Errorf("default endpoint %q", got)
	}
	e := &cliEnv{url: "not a url"}
	e.run(t, "", "ls").want(t, exitError, "", `invalid torpor endpoint "not a url"`)
}
