package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// baselineScript is the bare Python HTTP server torpor is compared with:
// what a user would write to serve a NOP handler without torpor. It is
// kept as plain as that on purpose, with only the settings any fair
// keep-alive server has: HTTP/1.1 (keep-alive), a thread per connection
// (so concurrent clients are served), and TCP_NODELAY, without which the
// separate header and body writes of http.server meet the client's
// delayed ACK and every call costs ~40 ms, a benchmark artefact (Go's
// net/http, which torpor's gateway uses, sets TCP_NODELAY by default).
// It prints its port on the first line of stdout once it listens.
const baselineScript = `
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class S(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

srv = S(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
`

// Baseline is a running bare Python HTTP server on 127.0.0.1.
type Baseline struct {
	// URL is the server's root, e.g. http://127.0.0.1:40123.
	URL string

	cmd    *exec.Cmd
	stderr *tailBuffer
	done   chan struct{}
	once   sync.Once
}

// StartBaseline starts the baseline server with the interpreter at
// python, which should be the real binary (a pyenv shim costs tens of ms
// per start and would linger as a wrapper process), and waits until it
// listens. Close stops it; cancelling ctx kills it too.
func StartBaseline(ctx context.Context, python string) (*Baseline, error) {
	// -I: isolated mode, so the user's PYTHON* variables and site
	// packages cannot slow down or alter the baseline.
	cmd := exec.CommandContext(ctx, python, "-I", "-c", baselineScript)
	setPdeathsig(cmd)
	b := &Baseline{cmd: cmd, stderr: &tailBuffer{max: 4 << 10}, done: make(chan struct{})}
	cmd.Stderr = b.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("baseline python server: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the baseline python server with %s: %w", python, err)
	}
	go func() { _ = cmd.Wait(); close(b.done) }()

	port := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		port <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case p := <-port:
		if _, err := strconv.Atoi(p); err != nil {
			b.Close()
			return nil, fmt.Errorf("baseline python server (%s) did not start: %s", python, b.stderr.String())
		}
		b.URL = "http://127.0.0.1:" + p
		return b, nil
	case <-time.After(15 * time.Second):
		b.Close()
		return nil, fmt.Errorf("baseline python server (%s) did not listen within 15s: %s", python, b.stderr.String())
	case <-ctx.Done():
		b.Close()
		return nil, ctx.Err()
	}
}

// Close stops the server and waits for it to exit.
func (b *Baseline) Close() {
	b.once.Do(func() {
		if b.cmd.Process != nil {
			_ = b.cmd.Process.Kill()
		}
		<-b.done
	})
}

// tailBuffer keeps the last max bytes written to it, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if s == "" {
		return "(no output)"
	}
	return s
}
