// Package agentproto owns the versioned wire protocol between a worker and
// the language agent running inside each instance (docs/agent-protocol.md):
// framing, message headers, and a Client that drives one agent over an
// inherited Unix socket. It is the only contract the agents in runtimes/
// share. It must not start, sandbox or kill processes (the worker does) and
// must not import torpor packages other than function and errdefs.
//
// Everything read from an agent is untrusted: user code runs in the same
// process as the agent and can write to its socket, so every frame is
// length-checked and every reply is matched against the request it answers.
package agentproto

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Version is the protocol's major version. Agents announce theirs in hello;
// the worker refuses an agent whose major differs. Compatible changes (new
// optional header fields, new message types answered with an error by old
// agents) do not bump it.
const Version = 1

// Frame limits. A frame over either limit is a protocol error: the reader
// refuses it before allocating.
const (
	PrefixSize    = 8        // uint32 BE header length + uint32 BE body length
	MaxHeaderSize = 1 << 20  // JSON header, bytes
	MaxBodySize   = 16 << 20 // raw body, bytes; above function.MaxPayloadBytes on purpose
)

// Message types (Header.Type).
const (
	TypeHello     = "hello"      // agent → worker, first frame
	TypeInit      = "init"       // worker → agent
	TypeReady     = "ready"      // agent → worker, init succeeded
	TypeInitError = "init-error" // agent → worker, init failed
	TypeInvoke    = "invoke"     // worker → agent, body = event JSON
	TypeResult    = "result"     // agent → worker, body = result JSON
	TypeError     = "error"      // agent → worker, a call (or request) failed
	TypeLog       = "log"        // agent → worker, body = captured output bytes
	TypePing      = "ping"       // worker → agent
	TypePong      = "pong"       // agent → worker

	// Templates (see docs/agent-protocol.md): each request carries
	// descriptors (SCM_RIGHTS) and is answered with forked.
	TypeForkTemplate = "fork-template" // worker → runtime template; fds: socket, status pipe
	TypeFork         = "fork"          // worker → function template; fd: socket
	TypeForked       = "forked"        // template → worker: the child's pid in the template's PID namespace
	TypeStarted      = "started"       // forked child → worker, after hello: set up (or init-error)

	// Checkpoints (see docs/agent-protocol.md).
	TypePrepareCheckpoint = "prepare-checkpoint" // worker → agent
	TypeCheckpointReady   = "checkpoint-ready"   // agent → worker; then the agent closes this socket
	TypeAfterRestore      = "after-restore"      // worker → agent, first frame on the new socket
	TypeResumed           = "resumed"            // agent → worker
	// Mid-call checkpoints: the worker signals the agent (CheckpointSignal);
	// the agent answers checkpoint-ready with the call's id, or
	// checkpoint-deferred while the call holds a socket the dump could not
	// capture (the worker signals again).
	TypeCheckpointDeferred = "checkpoint-deferred" // agent → worker, during a call
)

// Error types the agents use for protocol-level refusals (function.Error.ErrorType).
const (
	ErrorTypeUnknownMessage = "Protocol.UnknownMessage"
	ErrorTypeNotSupported   = "Protocol.NotSupported"
	ErrorTypeInvalidState   = "Protocol.InvalidState"
)

// Log streams (Header.Stream).
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// Header is the JSON header of a frame. One struct serves every message
// type; each message uses the fields documented beside them, and all but
// Type are omitted when empty. New fields may be added; existing ones never
// change meaning.
type Header struct {
	Type string `json:"type"`
	// ID names the call (invoke, result, error, log) or request (ping, pong).
	// Empty in a log frame means output produced outside any call.
	ID string `json:"id,omitempty"`

	// hello
	V       int    `json:"v,omitempty"`       // protocol major version the agent speaks
	Runtime string `json:"runtime,omitempty"` // e.g. "python3.11.7"
	Pid     int    `json:"pid,omitempty"`
	// Role is "runtime-template", "function-template" or (forked instances)
	// "instance"; empty for an instance the worker started itself.
	Role   string  `json:"role,omitempty"`
	WarmMS float64 `json:"warm_ms,omitempty"` // runtime template: its warm-up time
	// InheritedSockets (started) counts the sockets, other than this one,
	// that a forked instance found open: one or more retires its template.
	InheritedSockets int `json:"inherited_sockets,omitempty"`

	// fork-template: the function template's sandbox, as JSON
	Config json.RawMessage `json:"config,omitempty"`

	// init
	Function  string `json:"function,omitempty"`
	Version   int    `json:"version,omitempty"` // function version; 0 = $LATEST
	Handler   string `json:"handler,omitempty"`
	MemoryMB  int    `json:"memory_mb,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	ARN       string `json:"arn,omitempty"`
	LogGroup  string `json:"log_group,omitempty"`
	LogStream string `json:"log_stream,omitempty"` // optional; the agent derives a Lambda-style name when empty
	CodeDir   string `json:"code_dir,omitempty"`

	// ready
	InitMS float64 `json:"init_ms,omitempty"` // time the agent spent importing the code

	// invoke
	DeadlineMS int64  `json:"deadline_ms,omitempty"` // Unix milliseconds
	TraceID    string `json:"trace_id,omitempty"`
	// CheckpointListen (invoke): the call may be checkpointed while it
	// runs; on CheckpointSignal the agent listens on this socket path for
	// the restoring worker's connection.
	CheckpointListen string `json:"checkpoint_listen,omitempty"`
	// InCall (checkpoint-ready, resumed): the call that was running when
	// the agent handed its socket over, and runs on after the restore.
	InCall string `json:"in_call,omitempty"`
	// Reason (checkpoint-deferred): why the agent cannot be dumped now.
	Reason string `json:"reason,omitempty"`

	// log
	Stream string `json:"stream,omitempty"` // stdout|stderr

	// init-error, error
	Error *function.Error `json:"error,omitempty"`

	// prepare-checkpoint, checkpoint-ready
	Listen      string  `json:"listen,omitempty"`        // socket path inside the instance the agent listens on
	GC          *bool   `json:"gc,omitempty"`            // run the GC and trim the allocator first (default true)
	RSSBefore   int64   `json:"rss_before,omitempty"`    // bytes, before the GC
	RSSAfter    int64   `json:"rss_after,omitempty"`     // bytes, after the GC and trim
	GCMS        float64 `json:"gc_ms,omitempty"`         // time the GC and trim took
	Restored    bool    `json:"restored,omitempty"`      // after-restore: this process came from a snapshot
	ClockJumpMS float64 `json:"clock_jump_ms,omitempty"` // resumed: wall time since checkpoint-ready
}

// Frame is one protocol message: a header and a raw body (event, result or
// log bytes; never JSON-escaped).
type Frame struct {
	Header Header
	Body   []byte
}

// ErrProtocol classifies a peer that broke the protocol: a frame over the
// limits, a header that is not JSON, a reply that answers nothing we asked.
// The connection cannot be trusted afterwards.
var ErrProtocol = errors.New("agent protocol violation")

// WriteFrame writes f to w with a single Write, so frames from concurrent
// writers on a stream socket never interleave. A frame over the limits is
// refused before anything is written, with an error wrapping
// errdefs.ErrTooLarge.
func WriteFrame(w io.Writer, f *Frame) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := encodeFrame(&buf, enc, &f.Header, f.Body); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// encodeFrame appends the encoding of one frame to buf; enc must write to
// buf. Reusing buf and enc makes a frame cost no allocations.
func encodeFrame(buf *bytes.Buffer, enc *json.Encoder, h *Header, body []byte) error {
	if len(body) > MaxBodySize {
		return fmt.Errorf("encode %s frame: body is %d bytes, over the %d-byte limit: %w", h.Type, len(body), MaxBodySize, errdefs.ErrTooLarge)
	}
	start := buf.Len()
	var prefix [PrefixSize]byte
	buf.Write(prefix[:])
	if err := enc.Encode(h); err != nil { // Encode appends '\n': trimmed below
		buf.Truncate(start)
		return fmt.Errorf("encode %s frame header: %w", h.Type, err)
	}
	buf.Truncate(buf.Len() - 1)
	hlen := buf.Len() - start - PrefixSize
	if hlen > MaxHeaderSize {
		buf.Truncate(start)
		return fmt.Errorf("encode %s frame: header is %d bytes, over the %d-byte limit: %w", h.Type, hlen, MaxHeaderSize, errdefs.ErrTooLarge)
	}
	buf.Write(body)
	p := buf.Bytes()[start:]
	binary.BigEndian.PutUint32(p[0:4], uint32(hlen))
	binary.BigEndian.PutUint32(p[4:8], uint32(len(body)))
	return nil
}

// ReadFrame reads one frame from r. It returns io.EOF unchanged when r ends
// cleanly between frames, an error wrapping io.ErrUnexpectedEOF when r ends
// inside a frame, and an error wrapping ErrProtocol when the frame is over
// the limits or its header is not a JSON object with a "type". Wrap r in a
// bufio.Reader: ReadFrame makes three reads per frame.
func ReadFrame(r io.Reader) (*Frame, error) {
	f := new(Frame)
	var scratch []byte
	body, err := readFrame(r, &f.Header, &scratch)
	if err != nil {
		return nil, err
	}
	f.Body = body
	return f, nil
}

// readFrame reads one frame into h (which it resets first) and returns the
// body, freshly allocated because callers keep it. scratch is reused for the
// prefix and the header bytes.
func readFrame(r io.Reader, h *Header, scratch *[]byte) ([]byte, error) {
	buf := *scratch
	if cap(buf) < PrefixSize {
		buf = make([]byte, PrefixSize, 512)
		*scratch = buf
	}
	buf = buf[:PrefixSize]
	if n, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("read frame prefix: got %d of %d bytes: %w", n, PrefixSize, unexpected(err))
	}
	hlen := binary.BigEndian.Uint32(buf[0:4])
	blen := binary.BigEndian.Uint32(buf[4:8])
	if hlen > MaxHeaderSize {
		return nil, fmt.Errorf("%w: frame header is %d bytes, over the %d-byte limit", ErrProtocol, hlen, MaxHeaderSize)
	}
	if blen > MaxBodySize {
		return nil, fmt.Errorf("%w: frame body is %d bytes, over the %d-byte limit", ErrProtocol, blen, MaxBodySize)
	}
	if hlen == 0 {
		return nil, fmt.Errorf("%w: frame header is empty: every frame needs a JSON header with a \"type\"", ErrProtocol)
	}
	if cap(buf) < int(hlen) {
		buf = make([]byte, hlen)
		if hlen <= 64<<10 { // keep small scratch buffers only
			*scratch = buf
		}
	}
	buf = buf[:hlen]
	if n, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("read frame header: got %d of %d bytes: %w", n, hlen, unexpected(err))
	}
	*h = Header{}
	if err := json.Unmarshal(buf, h); err != nil {
		return nil, fmt.Errorf("%w: frame header is not a valid JSON object: %v (header starts %q)", ErrProtocol, err, clip(buf))
	}
	if h.Type == "" {
		return nil, fmt.Errorf("%w: frame header has no \"type\" (header starts %q)", ErrProtocol, clip(buf))
	}
	if blen == 0 {
		return nil, nil
	}
	body := make([]byte, blen)
	if n, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("read %s frame body: got %d of %d bytes: %w", h.Type, n, blen, unexpected(err))
	}
	return body, nil
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
