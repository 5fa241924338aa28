package agentproto

import (
	"bufio"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/testenv"
)

// fakeAgent runs script against the agent end of a fresh connection and
// returns a Client on the worker end. script gets a frame reader and the
// raw conn, so it can misbehave in ways a real agent would not.
func fakeAgent(t *testing.T, script func(r *bufio.Reader, conn net.Conn)) *Client {
	t.Helper()
	ours, theirs := socketpairConns(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer theirs.Close()
		script(bufio.NewReader(theirs), theirs)
	}()
	c := NewClient(ours)
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return c
}

func send(conn net.Conn, h Header, body string) {
	WriteFrame(conn, &Frame{Header: h, Body: []byte(body)})
}

func TestClientFailures(t *testing.T) {
	tests := []struct {
		name    string
		script  func(r *bufio.Reader, conn net.Conn)
		wantErr error
	}{
		{"result for another call", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
			send(conn, Header{Type: TypeResult, ID: "other"}, "1")
			ReadFrame(r)
		}, ErrProtocol},
		{"reply of the wrong type", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
			send(conn, Header{Type: TypeReady, ID: "c1"}, "")
			ReadFrame(r)
		}, ErrProtocol},
		{"error frame without error", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
			send(conn, Header{Type: TypeError, ID: "c1"}, "")
			ReadFrame(r)
		}, ErrProtocol},
		{"oversize frame", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
			conn.Write(rawFrame(MaxHeaderSize+1, 0, "", ""))
			ReadFrame(r)
		}, ErrProtocol},
		{"EOF mid-frame", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
			conn.Write(rawFrame(100, 0, `{"type":"res`, ""))
		}, ErrAgentExited},
		{"EOF before reply", func(r *bufio.Reader, conn net.Conn) {
			ReadFrame(r)
		}, ErrAgentExited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeAgent(t, tt.script)
			_, _, err := c.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1"}, nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Invoke error = %v, want %v", err, tt.wantErr)
			}
			if _, _, err := c.Invoke(testenv.Ctx(t), InvokeParams{ID: "c2"}, nil); !errors.Is(err, ErrUnusable) {
				t.Fatalf("second Invoke error = %v, want ErrUnusable", err)
			}
		})
	}
}

func TestHandshakeVersionMismatch(t *testing.T) {
	c := fakeAgent(t, func(r *bufio.Reader, conn net.Conn) {
		send(conn, Header{Type: TypeHello, V: Version + 1, Runtime: "future9", Pid: 1}, "")
		ReadFrame(r)
	})
	h, err := c.Handshake(testenv.Ctx(t))
	if !errors.Is(err, ErrVersionMismatch) || h.Version != Version+1 {
		t.Fatalf("Handshake = %+v, %v; want ErrVersionMismatch", h, err)
	}
}

func TestInvokeValidatesBeforeSending(t *testing.T) {
	c := fakeAgent(t, func(r *bufio.Reader, conn net.Conn) {
		for { // read, never answer
			if _, err := ReadFrame(r); err != nil {
				return
			}
		}
	})
	if _, _, err := c.Invoke(testenv.Ctx(t), InvokeParams{}, nil); err == nil {
		t.Fatal("Invoke without an id succeeded")
	}
	if _, _, err := c.Invoke(testenv.Ctx(t), InvokeParams{ID: "big", Payload: make([]byte, MaxBodySize+1)}, nil); err == nil {
		t.Fatal("Invoke with an oversize payload succeeded")
	}
	// Neither wrote anything, so the Client is still usable.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := c.Invoke(ctx, InvokeParams{ID: "c1"}, nil); errors.Is(err, ErrUnusable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Invoke after refused ones: %v, want a plain timeout", err)
	}
}

// TestClientSerialises runs invokes from many goroutines against an agent
// that would mix up interleaved requests.
func TestClientSerialises(t *testing.T) {
	c := fakeAgent(t, loopbackAgentConn)
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			var err error
			for i := 0; i < 50 && err == nil; i++ {
				_, _, err = c.Invoke(testenv.Ctx(t), InvokeParams{ID: "c"}, nil)
			}
			errs <- err
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func loopbackAgentConn(r *bufio.Reader, conn net.Conn) {
	for {
		f, err := ReadFrame(r)
		if err != nil {
			return
		}
		// Split the reply in two writes to catch a reader that would
		// accept a torn frame.
		var b []byte
		w := writerFunc(func(p []byte) (int, error) { b = append(b, p...); return len(p), nil })
		WriteFrame(w, &Frame{Header: Header{Type: TypeResult, ID: f.Header.ID}, Body: []byte("null")})
		conn.Write(b[:5])
		conn.Write(b[5:])
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
