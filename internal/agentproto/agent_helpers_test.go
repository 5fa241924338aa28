package agentproto

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/runtimes"
)

// agentUnderTest is one language agent the conformance test runs. Node and
// Java agents join by adding an entry to agentsUnderTest.
type agentUnderTest struct {
	name string
	cmd  func(t testing.TB) []string // argv; skips t when the runtime is missing
}

var agentsUnderTest = []agentUnderTest{
	// The source file run as a script.
	{name: "python", cmd: func(tb testing.TB) []string {
		return []string{testenv.Python(tb), pythonAgentPath(tb)}
	}},
	// As the worker runs it: the embedded copy written out and
	// precompiled, started through the bootstrap without site-packages.
	{name: "python-embedded", cmd: func(tb testing.TB) []string {
		py := testenv.Python(tb)
		dir := tb.TempDir()
		path := filepath.Join(dir, runtimes.PythonAgentName)
		if err := os.WriteFile(path, runtimes.PythonAgent, 0o644); err != nil {
			tb.Fatal(err)
		}
		if out, err := exec.Command(py, "-m", "py_compile", path).CombinedOutput(); err != nil {
			tb.Fatalf("py_compile: %v %s", err, out)
		}
		return []string{py, "-S", "-c", runtimes.PythonBootstrap, dir}
	}},
}

func pythonAgentPath(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "runtimes", "python", "torpor_agent.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// agentProc is a running agent and the Client talking to it.
type agentProc struct {
	cmd    *exec.Cmd
	client *Client
	done   chan struct{} // closed once the process has been reaped
	diag   *syncBuffer   // what the agent wrote to its original stdout/stderr
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

// spawnAgent starts argv with one end of a socketpair on fd 3, as the
// worker does (minus the sandbox), and returns a Client on the other end.
// Cleanup closes the socket and fails tb if the agent does not then exit.
func spawnAgent(tb testing.TB, argv []string) *agentProc {
	tb.Helper()
	p, err := startAgent(argv)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.stop(); err != nil {
			tb.Error(err)
		}
		if tb.Failed() {
			tb.Logf("agent diagnostics: %q", p.diag.String())
		}
	})
	return p
}

func startAgent(argv []string) (*agentProc, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "agent-conn")
	theirs := os.NewFile(uintptr(fds[1]), "agent-conn-child")
	defer theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("FileConn: %w", err)
	}
	p := &agentProc{done: make(chan struct{}), diag: new(syncBuffer)}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.ExtraFiles = []*os.File{theirs} // fd 3
	p.cmd.Env = append(os.Environ(), "TORPOR_AGENT_FD=3")
	p.cmd.Stdout, p.cmd.Stderr = p.diag, p.diag
	if err := p.cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("start %v: %w", argv, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	p.client = NewClient(conn)
	return p, nil
}

// stop closes the agent's socket and waits for it to exit, killing it
// (and reporting so) when it does not within 5s.
func (p *agentProc) stop() error {
	p.client.Close()
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("agent did not exit within 5s of its socket closing")
	}
}

// waitExit waits for the process to end and returns its exit code.
func (p *agentProc) waitExit(tb testing.TB) int {
	tb.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(5 * time.Second):
		tb.Fatalf("agent still running after 5s")
		return -1
	}
}

// writeCode writes files (name → content) into a fresh code directory.
func writeCode(tb testing.TB, files map[string]string) string {
	tb.Helper()
	dir := tb.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// logs collects log records.
type logs struct {
	mu   sync.Mutex
	recs []LogRecord
}

func (l *logs) add(r LogRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
}

// text concatenates what stream carried for callID.
func (l *logs) text(callID, stream string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		if r.CallID == callID && r.Stream == stream {
			b.Write(r.Data)
		}
	}
	return b.String()
}

func (l *logs) all() []LogRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LogRecord(nil), l.recs...)
}

// rawExchange sends h and returns the agent's reply: for message types the
// Client has no method for.
func rawExchange(ctx context.Context, c *Client, h Header) (Header, error) {
	if err := c.lock(ctx, "raw", h.ID); err != nil {
		return Header{}, err
	}
	defer c.unlock()
	reply, _, err := c.exchange(ctx, "raw", h.ID, &h, nil, nil)
	if err != nil {
		return Header{}, err
	}
	return *reply, nil
}
