package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"
)

// SeriesFork is the name of the fork-per-call baseline in the fast-start
// benchmarks' tables and files.
const SeriesFork = "fork-per-call"

// forkHandlerScript wraps a handler (Python source defining handler(e, c))
// into a program that reads one event on stdin and writes the result on
// stdout, the contract of a classic fork-per-request watchdog (OpenFaaS's
// classic watchdog, CGI): the process lives for exactly one call.
func forkHandlerScript(handler string) string {
	return "import json, sys\n" + handler + "\nsys.stdout.write(json.dumps(handler(json.loads(sys.stdin.read() or 'null'), None)))\n"
}

// Fork-per-call baseline scripts: the NOP handler, and the 50 ms sleep of
// the bursts benchmark's background.
var (
	forkNOPScript   = forkHandlerScript(nopCode)
	forkSleepScript = forkHandlerScript(sleepCode)
)

// ForkBaseline is the baseline of the fast-start benchmarks: an HTTP
// server on 127.0.0.1 that, like a classic fork-per-request watchdog,
// starts a fresh `python -I -S -c <script>` for every request, feeds it
// the body on stdin and answers with its stdout once it has exited. It is
// what a platform without warm instances or templates costs per call.
type ForkBaseline struct {
	// URL is the server's root, e.g. http://127.0.0.1:40123; POST
	// URL+path runs the script registered under path.
	URL string

	python  string
	scripts map[string]string
	srv     *http.Server
	served  chan struct{}
	calls   sync.WaitGroup // requests being served, each with its process
	spawned atomic.Int64
	once    sync.Once
}

// StartForkBaseline starts the server. python should be the real binary
// (a pyenv shim adds a shell script's start to every call); scripts maps a
// request path ("/nop") to the Python program run for it. Close stops it.
func StartForkBaseline(ctx context.Context, python string, scripts map[string]string) (*ForkBaseline, error) {
	if _, err := exec.LookPath(python); err != nil {
		return nil, fmt.Errorf("fork-per-call baseline: interpreter %s: %w", python, err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fork-per-call baseline: listen: %w", err)
	}
	b := &ForkBaseline{
		URL:     "http://" + ln.Addr().String(),
		python:  python,
		scripts: scripts,
		served:  make(chan struct{}),
	}
	b.srv = &http.Server{Handler: http.HandlerFunc(b.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln); close(b.served) }()
	return b, nil
}

// Spawned returns the number of processes started so far.
func (b *ForkBaseline) Spawned() int64 { return b.spawned.Load() }

func (b *ForkBaseline) serve(w http.ResponseWriter, r *http.Request) {
	b.calls.Add(1)
	defer b.calls.Done()
	script, ok := b.scripts[r.URL.Path]
	if !ok || r.Method != http.MethodPost {
		http.Error(w, "POST one of the baseline's paths", http.StatusNotFound)
		return
	}
	event, err := io.ReadAll(io.LimitReader(r.Body, 6<<20))
	if err != nil {
		http.Error(w, "read the event: "+err.Error(), http.StatusBadRequest)
		return
	}
	// -I: no user site or PYTHON* variables; -S: no site module, the
	// cheapest start a per-call process can have.
	cmd := exec.CommandContext(r.Context(), b.python, "-I", "-S", "-c", script)
	setPdeathsig(cmd)
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 2 << 10}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(event), &stdout, stderr
	b.spawned.Add(1)
	if err := cmd.Run(); err != nil {
		http.Error(w, fmt.Sprintf("%s: %v: %s", b.python, err, stderr), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(stdout.Bytes())
}

// Close stops the server, killing the processes of calls in flight, and
// waits for them.
func (b *ForkBaseline) Close() {
	b.once.Do(func() {
		_ = b.srv.Close() // cancels the requests' contexts: CommandContext kills
		<-b.served
		b.calls.Wait()
	})
}
