package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/function"
)

// Fork asks a template to fork: a runtime template a function template
// (typ TypeForkTemplate, config its sandbox, files its socket and status
// pipe), a function template an instance (TypeFork, config nil, files its
// socket). The files travel with the request (SCM_RIGHTS); the Client's
// connection must be a *net.UnixConn. It returns the child's pid in the
// template's PID namespace. A refusal (*function.Error in an error reply)
// comes back as a *ForkError; the Client stays usable.
func (c *Client) Fork(ctx context.Context, typ string, config any, files ...*os.File) (int, error) {
	id := "fork-" + strconv.FormatUint(c.seq.Add(1), 10)
	req := &Header{Type: typ, ID: id}
	if config != nil {
		b, err := json.Marshal(config)
		if err != nil {
			return 0, fmt.Errorf("%s: encode config: %w", typ, err)
		}
		req.Config = b
	}
	if _, ok := c.conn.(*net.UnixConn); !ok {
		return 0, fmt.Errorf("%s: the connection is not a Unix socket: cannot pass descriptors", typ)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if err := c.lock(ctx, typ, id); err != nil {
		return 0, err
	}
	defer c.unlock()
	c.oob = unix.UnixRights(fds...)
	h, _, err := c.exchange(ctx, typ, id, req, nil, nil)
	if err != nil {
		return 0, err
	}
	switch {
	case h.ID != id:
		return 0, c.violation(typ, id, "template answered %q for %q", h.Type, h.ID)
	case h.Type == TypeError && h.Error != nil:
		return 0, &ForkError{Op: typ, Err: *h.Error}
	case h.Type != TypeForked || h.Pid <= 0:
		return 0, c.violation(typ, id, "template answered %s with %q (pid %d)", typ, h.Type, h.Pid)
	}
	return h.Pid, nil
}

// ForkError is a template's refusal to fork, with the template's reason.
type ForkError struct {
	Op  string
	Err function.Error
}

func (e *ForkError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Op, e.Err.ErrorType, e.Err.ErrorMessage)
}

// SocketPair makes the socket a worker talks to an agent on: it returns
// the worker's end, and the end to hand to the agent (as an inherited fd, or
// with a template's fork request). With forked set, the worker's end is
// ready for HandshakeForked: the kernel attaches the sender's credentials,
// its pid translated into the worker's PID namespace, to what the agent
// sends.
func SocketPair(forked bool) (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	if forked {
		if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return nil, nil, fmt.Errorf("SO_PASSCRED: %w", err)
		}
	}
	parent := os.NewFile(uintptr(fds[0]), "agent-ctl")
	c, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("control socket: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "agent-ctl-child"), nil
}

// HandshakeForked reads the hello of an agent a template forked, on conn
// (from SocketPair(true)), and returns a Client for it and the
// hello, with HostPid set from the kernel's credentials — a forked agent
// cannot know its own pid outside its namespace, and must not be trusted
// to say. The child says hello before it sets itself up, so that the
// worker can move it into its cgroup meanwhile; Started waits for the rest.
func HandshakeForked(ctx context.Context, conn *net.UnixConn) (*Client, Hello, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	cr := &credReader{c: conn}
	f, err := ReadFrame(cr)
	stop()
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w (%v)", ErrAgentExited, err)
		}
		return nil, Hello{}, fmt.Errorf("handshake with forked agent: %w", err)
	}
	h := &f.Header
	switch {
	case h.Type == TypeInitError && h.Error != nil:
		return nil, Hello{}, &InitError{Err: *h.Error}
	case h.Type != TypeHello:
		return nil, Hello{}, fmt.Errorf("handshake with forked agent: %w: first frame is %q, want %q", ErrProtocol, h.Type, TypeHello)
	case h.V != Version:
		return nil, Hello{}, fmt.Errorf("handshake: %w: agent %s speaks v%d, this worker speaks v%d", ErrVersionMismatch, h.Runtime, h.V, Version)
	case cr.pid <= 0:
		return nil, Hello{}, fmt.Errorf("handshake with forked agent: no credentials on its hello (SO_PASSCRED not set?)")
	}
	hello := Hello{Version: h.V, Runtime: h.Runtime, Pid: h.Pid, Role: h.Role, WarmMS: h.WarmMS, HostPid: cr.pid}
	return NewClient(conn), hello, nil
}

// Started waits for a forked child's started, which follows its hello once
// it has set itself up: a function template has built its sandbox, an
// instance reports the sockets it inherited besides its own. A function
// template that failed answers init-error, returned as an *InitError.
func (c *Client) Started(ctx context.Context) (inheritedSockets int, err error) {
	const op = "started"
	if err := c.lock(ctx, op, ""); err != nil {
		return 0, err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, op, "", nil, nil, nil)
	switch {
	case err != nil:
		return 0, err
	case h.Type == TypeInitError && h.Error != nil:
		return 0, &InitError{Err: *h.Error}
	case h.Type != TypeStarted:
		return 0, c.violation(op, "", "forked agent sent %q after hello, want %q", h.Type, TypeStarted)
	}
	return h.InheritedSockets, nil
}

// credReader reads from a Unix socket and keeps the sender's pid from the
// first SCM_CREDENTIALS message that arrives.
type credReader struct {
	c   *net.UnixConn
	oob [128]byte
	pid int
}

func (r *credReader) Read(p []byte) (int, error) {
	n, oobn, _, _, err := r.c.ReadMsgUnix(p, r.oob[:])
	if r.pid == 0 && oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(r.oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if cred, cerr := unix.ParseUnixCredentials(&m); cerr == nil {
					r.pid = int(cred.Pid)
				}
			}
		}
	}
	return n, err
}
