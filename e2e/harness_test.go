// Package e2e boots the real torpor binary and drives it over HTTP, the CLI
// and the AWS SDK, as a user would. Tests need root (sandboxes); CI runs as
// root, so nothing skips there.
package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/codezip"
)

var torporBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			fmt.Println("e2e: the end-to-end tests need root (torpor creates sandboxes), and CI must not skip them")
			os.Exit(1)
		}
		fmt.Println("e2e: skipping: the end-to-end tests need root (torpor creates sandboxes); run them with sudo")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "torpor-e2e-bin")
	if err != nil {
		panic(err)
	}
	torporBin = filepath.Join(dir, "torpor")
	// torpor-init beside torpor, as scripts/install.sh installs it.
	for _, b := range [][2]string{{torporBin, "../cmd/torpor"}, {filepath.Join(dir, "torpor-init"), "../cmd/torpor-init"}} {
		build := exec.Command("go", "build", "-o", b[0], b[1])
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Println("e2e: building", b[1], "failed:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running `torpor up` process.
type server struct {
	t        *testing.T
	home     string
	endpoint string
	// token is the API token the server wrote, sent on every request the
	// harness makes ("" under --auth none).
	token string
	args  []string
	cmd   *exec.Cmd
	out   *syncBuffer
	done  chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer boots `torpor up` in a fresh home and waits until it serves.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	s := &server{t: t, home: t.TempDir(), args: args}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) start() {
	t := s.t
	t.Helper()
	_ = os.Remove(filepath.Join(s.home, "endpoint"))
	args := append([]string{"up", "--home", s.home, "--listen", "127.0.0.1:0", "--log-level", "debug"}, s.args...)
	s.cmd = exec.Command(torporBin, args...)
	s.out = &syncBuffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start torpor: %v", err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	eventually(t, 30*time.Second, "torpor to serve", func() error {
		select {
		case <-s.done:
			t.Fatalf("torpor exited early:\n%s", s.out.String())
		default:
		}
		b, err := os.ReadFile(filepath.Join(s.home, "endpoint"))
		if err != nil {
			return err
		}
		s.endpoint = strings.TrimSpace(string(b))
		resp, err := http.Get(s.endpoint + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("healthz: %d", resp.StatusCode)
		}
		return nil
	})
	s.token = s.readToken()
}

// readToken reads the API token the server uses: from --api-token-file or
// <home>/api-token, or none under --auth none. The server writes the file
// before it serves.
func (s *server) readToken() string {
	t := s.t
	t.Helper()
	file := filepath.Join(s.home, "api-token")
	for i := 0; i+1 < len(s.args); i++ {
		switch {
		case s.args[i] == "--auth" && s.args[i+1] == "none":
			return ""
		case s.args[i] == "--api-token-file":
			file = s.args[i+1]
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read the API token: %v\n%s", err, tail(s.out.String(), 3000))
	}
	return strings.TrimSpace(string(b))
}

// authorize adds the server's API token to req.
func (s *server) authorize(req *http.Request) {
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
}

// kill SIGKILLs the server, as a crash would.
func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(40 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	if s.t.Failed() {
		s.t.Logf("torpor output:\n%s", tail(s.out.String(), 8000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

// cli runs the torpor CLI against the server, with its token.
func (s *server) cli(args ...string) (string, string, error) {
	return s.cliEnv([]string{"TORPOR_TOKEN=" + s.token}, args...)
}

// cliEnv runs the torpor CLI against the server with env added to the
// environment (later entries win).
func (s *server) cliEnv(env []string, args ...string) (string, string, error) {
	cmd := exec.Command(torporBin, args...)
	cmd.Env = append(append(os.Environ(), "TORPOR_ENDPOINT="+s.endpoint), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// zipFiles builds a code package.
func zipFiles(t *testing.T, files map[string]string) []byte {
	t.Helper()
	b, err := codezip.FromFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type deployOpts struct {
	Handler     string            `json:"handler"`
	Runtime     string            `json:"runtime"`
	MemoryMB    int               `json:"memory_mb,omitempty"`
	TimeoutS    float64           `json:"timeout_s,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Concurrency int               `json:"concurrency,omitempty"`
	CodeZip     string            `json:"code_zip"`
}

// deployZip deploys a zip over REST and returns the status and body.
func (s *server) deployZip(name string, zipb []byte, o deployOpts) (int, string) {
	if o.Handler == "" {
		o.Handler = "app.handler"
	}
	if o.Runtime == "" {
		o.Runtime = "python3"
	}
	o.CodeZip = base64.StdEncoding.EncodeToString(zipb)
	body, _ := json.Marshal(o)
	req, _ := http.NewRequest(http.MethodPut, s.endpoint+"/v1/functions/"+name, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	s.authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("deploy %s: %v", name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// deploy deploys app.py source and fails the test unless it is accepted.
func (s *server) deploy(name, source string, o deployOpts) {
	s.t.Helper()
	code, body := s.deployZip(name, zipFiles(s.t, map[string]string{"app.py": source}), o)
	if code != 200 && code != 201 {
		s.t.Fatalf("deploy %s: %d %s", name, code, body)
	}
}

type invokeResp struct {
	Status  int
	Header  http.Header
	Body    string
	FuncErr bool
}

// invoke calls a function through the REST API.
func (s *server) invoke(name, payload string) invokeResp {
	return s.post("/v1/functions/"+name+"/invoke", payload, nil)
}

// post sends payload to path with the server's token; hdr is set after
// it, so a test can replace or (with "") drop the Authorization header.
func (s *server) post(path, payload string, hdr map[string]string) invokeResp {
	s.t.Helper()
	return s.request(http.MethodPost, path, payload, hdr)
}

// get is post's GET.
func (s *server) get(path string, hdr map[string]string) invokeResp {
	s.t.Helper()
	return s.request(http.MethodGet, path, "", hdr)
}

func (s *server) request(method, path, payload string, hdr map[string]string) invokeResp {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.endpoint+path, strings.NewReader(payload))
	s.authorize(req)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return invokeResp{Status: resp.StatusCode, Header: resp.Header, Body: string(b),
		FuncErr: resp.Header.Get("X-Torpor-Function-Error") != "" || resp.Header.Get("X-Amz-Function-Error") != ""}
}

func (s *server) getJSON(path string, v any) int {
	s.t.Helper()
	r := s.get(path, nil)
	if v != nil && r.Status == 200 {
		if err := json.Unmarshal([]byte(r.Body), v); err != nil {
			s.t.Fatalf("GET %s: decode %q: %v", path, r.Body, err)
		}
	}
	return r.Status
}

// mustOK asserts a successful call and returns its body.
func mustOK(t *testing.T, r invokeResp) string {
	t.Helper()
	if r.Status != 200 || r.FuncErr {
		t.Fatalf("call failed: %d funcErr=%v %s", r.Status, r.FuncErr, r.Body)
	}
	return r.Body
}

// funcError decodes a Lambda-shaped error body.
func funcError(t *testing.T, r invokeResp) (typ, msg string, stack []string) {
	t.Helper()
	if !r.FuncErr {
		t.Fatalf("expected a function error, got %d %s", r.Status, r.Body)
	}
	var e struct {
		ErrorMessage string   `json:"errorMessage"`
		ErrorType    string   `json:"errorType"`
		StackTrace   []string `json:"stackTrace"`
	}
	if err := json.Unmarshal([]byte(r.Body), &e); err != nil {
		t.Fatalf("error body %q: %v", r.Body, err)
	}
	return e.ErrorType, e.ErrorMessage, e.StackTrace
}
