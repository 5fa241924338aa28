package agentproto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// ErrUnusable is returned (wrapped) by every call on a Client after a call
// failed with a transport, protocol or context error: the agent may be
// half-way through a frame, so the instance must be killed and replaced.
var ErrUnusable = errors.New("agent connection unusable after an earlier failure; kill the instance and start a new one")

// Client drives one agent over its socket: Handshake, then Init, then any
// number of Invoke calls. Calls are serialised; a Client is safe for
// concurrent use but runs one exchange at a time. After a context error,
// EOF or protocol violation every later call fails with ErrUnusable.
type Client struct {
	conn net.Conn
	sem  chan struct{} // held for a whole exchange; a channel so waiting honours ctx

	// Owned by the goroutine holding sem; reused so a warm call allocates
	// only what it returns.
	br       *bufio.Reader
	wbuf     bytes.Buffer
	enc      *json.Encoder // writes to wbuf
	out      Header        // request being sent
	in       Header        // reply being read
	scratch  []byte
	deadline time.Time // deadline currently set on conn
	stale    bool      // conn deadline may differ from deadline
	broken   error     // first fatal error
	oob      []byte    // control message (SCM_RIGHTS) for the next request

	imu         sync.Mutex // orders interrupt against the end of an exchange
	active      bool       // an exchange is running; guarded by imu
	interruptFn func()     // c.interrupt, bound once: saves an allocation per call

	closed atomic.Bool
	seq    atomic.Uint64 // ping ids
}

// bufSize is the read buffer per Client. Small on purpose (a node holds
// thousands of instances): bodies larger than it are read straight into
// their own slice, bypassing the buffer.
const bufSize = 16 << 10

// NewClient returns a Client speaking on conn, normally the worker's end of
// the socketpair whose other end the agent inherited. The Client owns conn.
func NewClient(conn net.Conn) *Client {
	c := &Client{
		conn: conn,
		sem:  make(chan struct{}, 1),
		br:   bufio.NewReaderSize(conn, bufSize),
	}
	c.enc = json.NewEncoder(&c.wbuf)
	c.enc.SetEscapeHTML(false)
	c.interruptFn = c.interrupt
	return c
}

// Handshake reads the agent's hello. It fails with ErrVersionMismatch when
// the agent speaks another protocol major version. Give ctx a deadline: an
// agent that never starts would otherwise be waited for forever.
func (c *Client) Handshake(ctx context.Context) (Hello, error) {
	if err := c.lock(ctx, "handshake", ""); err != nil {
		return Hello{}, err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, "handshake", "", nil, nil, nil)
	if err != nil {
		return Hello{}, err
	}
	if h.Type != TypeHello {
		return Hello{}, c.violation("handshake", "", "agent's first frame is %q, want %q", h.Type, TypeHello)
	}
	hello := Hello{Version: h.V, Runtime: h.Runtime, Pid: h.Pid, Role: h.Role, WarmMS: h.WarmMS}
	if h.V != Version {
		c.broken = fmt.Errorf("handshake: %w: agent %s (pid %d) speaks v%d, this worker speaks v%d; deploy the agent from the same torpor build",
			ErrVersionMismatch, h.Runtime, h.Pid, h.V, Version)
		return hello, c.broken
	}
	return hello, nil
}

// Init makes the agent import the function's code and resolve its handler.
// Output the import prints reaches onLog (CallID ""), which may be nil to
// discard it. It returns the agent's measured import time, or an *InitError
// when the code failed to load (the Client stays usable, the instance is
// not worth keeping).
func (c *Client) Init(ctx context.Context, p InitParams, onLog func(LogRecord)) (time.Duration, error) {
	req := Header{
		Type:      TypeInit,
		Function:  p.Function,
		Version:   p.Version,
		Handler:   p.Handler,
		MemoryMB:  p.MemoryMB,
		TimeoutMS: p.Timeout.Milliseconds(),
		ARN:       p.ARN,
		LogGroup:  p.LogGroup,
		LogStream: p.LogStream,
		CodeDir:   p.CodeDir,
	}
	if err := c.lock(ctx, "init", p.Function); err != nil {
		return 0, err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, "init", p.Function, &req, nil, onLog)
	if err != nil {
		return 0, err
	}
	switch h.Type {
	case TypeReady:
		return time.Duration(h.InitMS * float64(time.Millisecond)), nil
	case TypeInitError:
		if h.Error == nil {
			return 0, c.violation("init", p.Function, "init-error frame carries no error")
		}
		return 0, &InitError{Err: *h.Error}
	default:
		return 0, c.violation("init", p.Function, "agent answered init with %q, want %q or %q", h.Type, TypeReady, TypeInitError)
	}
}

// Invoke runs one call. A handler failure comes back as ferr (err nil);
// err means the call could not complete: ctx ended (err wraps ctx.Err(),
// returned as soon as ctx is done), the agent exited (ErrAgentExited) or
// broke the protocol (ErrProtocol). After such an err the instance must be
// killed. Output the call writes reaches onLog before Invoke returns; onLog
// may be nil to discard it.
func (c *Client) Invoke(ctx context.Context, p InvokeParams, onLog func(LogRecord)) (result []byte, ferr *function.Error, err error) {
	if p.ID == "" {
		return nil, nil, errdefs.Invalid("invoke: empty call id: every call needs an id to match its result")
	}
	dl := p.Deadline
	if dl.IsZero() {
		dl, _ = ctx.Deadline()
	}
	req := Header{Type: TypeInvoke, ID: p.ID, TraceID: p.TraceID, CheckpointListen: p.CheckpointListen}
	if !dl.IsZero() {
		req.DeadlineMS = dl.UnixMilli()
	}
	if err := c.lock(ctx, "invoke", p.ID); err != nil {
		return nil, nil, err
	}
	defer c.unlock()
	h, body, err := c.exchange(ctx, "invoke", p.ID, &req, p.Payload, onLog)
	if err != nil {
		return nil, nil, err
	}
	return c.callReply(ctx, "invoke", p.ID, h, body, onLog)
}

// Await collects the result of call, which was running when its instance
// was checkpointed and runs on in this restored instance (AfterRestore
// reported it in Resumed.InCall). It returns as Invoke does.
func (c *Client) Await(ctx context.Context, call string, onLog func(LogRecord)) (result []byte, ferr *function.Error, err error) {
	if err := c.lock(ctx, "await", call); err != nil {
		return nil, nil, err
	}
	defer c.unlock()
	h, body, err := c.exchange(ctx, "await", call, nil, nil, onLog)
	if err != nil {
		return nil, nil, err
	}
	return c.callReply(ctx, "await", call, h, body, onLog)
}

// callReply reads a call's outcome from its first non-log frame h: the
// result, the handler's error, or a hand-over for a checkpoint (after any
// number of deferrals). The caller holds the lock.
func (c *Client) callReply(ctx context.Context, op, id string, h *Header, body []byte, onLog func(LogRecord)) ([]byte, *function.Error, error) {
	var ck Checkpointed
	var firstDefer time.Time
	for h.Type == TypeCheckpointDeferred && h.ID == id {
		if ck.Defers == 0 {
			firstDefer = time.Now()
		}
		ck.Defers++
		ck.Reason = h.Reason
		var err error
		if h, body, err = c.exchange(ctx, op, id, nil, nil, onLog); err != nil {
			return nil, nil, err
		}
	}
	if h.ID != id {
		return nil, nil, c.violation(op, id, "agent answered with %q for call %q", h.Type, h.ID)
	}
	switch h.Type {
	case TypeResult:
		return body, nil, nil
	case TypeError:
		if h.Error == nil {
			return nil, nil, c.violation(op, id, "error frame carries no error")
		}
		return nil, h.Error, nil
	case TypeCheckpointReady:
		if h.InCall != id {
			return nil, nil, c.violation(op, id, "checkpoint-ready during call %q names call %q", id, h.InCall)
		}
		ck.CallID, ck.RSS = id, h.RSSAfter
		if !firstDefer.IsZero() {
			ck.Wait = time.Since(firstDefer)
		}
		if err := c.awaitHandOver(ctx, op, id, onLog); err != nil {
			return nil, nil, err
		}
		return nil, nil, &ck
	default:
		return nil, nil, c.violation(op, id, "agent answered %s with %q, want %q or %q", op, h.Type, TypeResult, TypeError)
	}
}

// Ping checks the agent is serving. Output produced between calls that
// arrives meanwhile goes to onLog, which may be nil.
func (c *Client) Ping(ctx context.Context, onLog func(LogRecord)) error {
	id := "ping-" + strconv.FormatUint(c.seq.Add(1), 10)
	if err := c.lock(ctx, "ping", id); err != nil {
		return err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, "ping", id, &Header{Type: TypePing, ID: id}, nil, onLog)
	if err != nil {
		return err
	}
	if h.Type != TypePong || h.ID != id {
		return c.violation("ping", id, "agent answered ping with %q for %q", h.Type, h.ID)
	}
	return nil
}

// Close closes the connection. A call blocked in another goroutine fails
// with net.ErrClosed. The agent exits when its socket closes.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}

// lock takes the Client for one exchange; unlock releases it.
func (c *Client) lock(ctx context.Context, op, id string) error {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return wrapOp(op, id, ctx.Err())
	}
	var err error
	switch {
	case c.broken != nil:
		err = fmt.Errorf("%s: %w (%v)", opName(op, id), ErrUnusable, c.broken)
	case c.closed.Load():
		err = fmt.Errorf("%s: client closed: %w", opName(op, id), net.ErrClosed)
	case ctx.Err() != nil:
		err = wrapOp(op, id, ctx.Err())
	}
	if err != nil {
		<-c.sem
	}
	return err
}

func (c *Client) unlock() { <-c.sem }

// exchange sends req (when not nil) with body and returns the first reply
// that is not a log frame, handing log frames to onLog on the way. The
// caller holds the lock. The returned header is c.in, valid until the next
// exchange. Every error it returns, but a request that could not be
// encoded, leaves the Client unusable.
func (c *Client) exchange(ctx context.Context, op, id string, req *Header, body []byte, onLog func(LogRecord)) (*Header, []byte, error) {
	// The conn deadline makes a blocked read return when ctx's deadline
	// passes; interrupt (via AfterFunc) does the same on cancellation.
	dl, _ := ctx.Deadline()
	if c.stale || !dl.Equal(c.deadline) {
		if err := c.conn.SetDeadline(dl); err != nil {
			return nil, nil, c.fail(ctx, op, id, err)
		}
		c.deadline, c.stale = dl, false
	}
	if ctx.Done() != nil {
		c.imu.Lock()
		c.active = true
		c.imu.Unlock()
		stop := context.AfterFunc(ctx, c.interruptFn)
		defer func() {
			if !stop() {
				c.stale = true // interrupt ran or is running: the conn deadline is in the past
			}
			c.imu.Lock()
			c.active = false
			c.imu.Unlock()
		}()
	}

	if req != nil {
		c.out = *req
		c.wbuf.Reset()
		if err := encodeFrame(&c.wbuf, c.enc, &c.out, body); err != nil {
			return nil, nil, wrapOp(op, id, err) // nothing was written: still usable
		}
		var err error
		if len(c.oob) > 0 { // descriptors ride on the frame's first byte
			_, _, err = c.conn.(*net.UnixConn).WriteMsgUnix(c.wbuf.Bytes(), c.oob, nil)
			c.oob = nil
		} else {
			_, err = c.conn.Write(c.wbuf.Bytes())
		}
		if c.wbuf.Cap() > 1<<20 {
			c.wbuf = bytes.Buffer{} // don't pin a multi-MB event between calls
		}
		if err != nil {
			return nil, nil, c.fail(ctx, op, id, err)
		}
	}
	for {
		rbody, err := readFrame(c.br, &c.in, &c.scratch)
		if err != nil {
			return nil, nil, c.fail(ctx, op, id, err)
		}
		if c.in.Type != TypeLog {
			return &c.in, rbody, nil
		}
		if onLog != nil {
			onLog(LogRecord{CallID: c.in.ID, Stream: c.in.Stream, Data: rbody})
		}
	}
}

// interrupt aborts the exchange in flight when its ctx is cancelled.
func (c *Client) interrupt() {
	c.imu.Lock()
	defer c.imu.Unlock()
	if c.active {
		c.conn.SetDeadline(time.Unix(1, 0)) // in the past: blocked I/O returns now
	}
}

// fail classifies an I/O error of the exchange in flight and marks the
// Client unusable.
func (c *Client) fail(ctx context.Context, op, id string, err error) error {
	var out error
	switch {
	case ctx.Err() != nil:
		out = wrapOp(op, id, ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded):
		if _, ok := ctx.Deadline(); ok {
			// The conn timer can fire a hair before ctx's own timer.
			<-ctx.Done()
			out = wrapOp(op, id, ctx.Err())
		} else {
			out = wrapOp(op, id, err)
		}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		out = fmt.Errorf("%s: %w (%v)", opName(op, id), ErrAgentExited, err)
	case errors.Is(err, net.ErrClosed) && c.closed.Load():
		out = fmt.Errorf("%s: client closed: %w", opName(op, id), err)
	default:
		out = wrapOp(op, id, err)
	}
	c.broken = out
	return out
}

// violation reports a reply that breaks the protocol and marks the Client
// unusable.
func (c *Client) violation(op, id, format string, args ...any) error {
	c.broken = fmt.Errorf("%s: %w: %s", opName(op, id), ErrProtocol, fmt.Sprintf(format, args...))
	return c.broken
}

func wrapOp(op, id string, err error) error {
	return fmt.Errorf("%s: %w", opName(op, id), err)
}

func opName(op, id string) string {
	if id == "" {
		return op
	}
	return op + " " + id
}
