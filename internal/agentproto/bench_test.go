package agentproto

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/testenv"
)

// BenchmarkInvokeNOP measures one warm invoke round trip of a handler that
// returns None: Go client + socket + agent. The go-loopback sub-benchmark
// is the baseline: an in-process goroutine answers each invoke, so it is
// the Go client and kernel share; the difference is the agent's.
//
//	go test ./internal/agentproto/ -run '^$' -bench 'InvokeNOP|AgentStartup' -benchmem
func BenchmarkInvokeNOP(b *testing.B) {
	b.Run("agent=go-loopback", func(b *testing.B) {
		ours, theirs := socketpairConns(b)
		go loopbackAgent(theirs)
		benchInvoke(b, NewClient(ours))
	})
	for _, a := range agentsUnderTest {
		b.Run("agent="+a.name, func(b *testing.B) {
			p := spawnAgent(b, a.cmd(b))
			ctx := testenv.Ctx(b)
			if _, err := p.client.Handshake(ctx); err != nil {
				b.Fatal(err)
			}
			dir := writeCode(b, map[string]string{"app.py": "def handler(event, context):\n    return None\n"})
			if _, err := p.client.Init(ctx, initParams(dir), nil); err != nil {
				b.Fatal(err)
			}
			benchInvoke(b, p.client)
		})
	}
}

func benchInvoke(b *testing.B, c *Client) {
	// A deadline, as the worker always sets one: exercises the ctx path.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	p := InvokeParams{ID: "bench-call-0001", Payload: []byte(`{}`), Deadline: time.Now().Add(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		res, ferr, err := c.Invoke(ctx, p, nil)
		if err != nil || ferr != nil || string(res) != "null" {
			b.Fatalf("Invoke: %s %v %v", res, ferr, err)
		}
	}
}

func socketpairConns(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tb.TempDir() + "/s", Net: "unix"})
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	cli, err := net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := l.AcceptUnix()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close(); srv.Close() })
	return cli, srv
}

// loopbackAgent answers every invoke with "null" until conn closes.
func loopbackAgent(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		f, err := ReadFrame(br)
		if err != nil {
			return
		}
		if WriteFrame(conn, &Frame{Header: Header{Type: TypeResult, ID: f.Header.ID}, Body: []byte("null")}) != nil {
			return
		}
	}
}

// BenchmarkAgentStartup measures spawning an agent until it has said hello
// and until it is ready to serve a trivial handler, against the baseline
// of starting and exiting the bare interpreter with the same flags.
func BenchmarkAgentStartup(b *testing.B) {
	for _, a := range agentsUnderTest {
		argv := a.cmd(b)
		dir := writeCode(b, map[string]string{"app.py": "def handler(event, context):\n    return None\n"})
		b.Run("agent="+a.name+"/baseline=interpreter-exit", func(b *testing.B) {
			bare := []string{argv[0], "-c", "pass"}
			if argv[1] == "-S" {
				bare = []string{argv[0], "-S", "-c", "pass"}
			}
			for b.Loop() {
				if out, err := exec.Command(bare[0], bare[1:]...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %v %s", bare, err, out)
				}
			}
		})
		for _, upTo := range []string{"hello", "ready"} {
			b.Run("agent="+a.name+"/to="+upTo, func(b *testing.B) {
				for b.Loop() {
					p, err := startAgent(argv)
					if err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err = p.client.Handshake(ctx)
					if err == nil && upTo == "ready" {
						_, err = p.client.Init(ctx, initParams(dir), nil)
					}
					cancel()
					b.StopTimer()
					if serr := p.stop(); err == nil {
						err = serr
					}
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}
