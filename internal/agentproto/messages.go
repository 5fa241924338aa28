package agentproto

import (
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/function"
)

// ErrAgentExited is returned (wrapped) when the agent's socket reaches EOF or
// is reset: the instance died or closed the socket, for example because the
// handler called os._exit or ran out of memory. The Client is unusable
// afterwards; the worker should reap the process and report the call failed.
var ErrAgentExited = errors.New("agent exited")

// ErrVersionMismatch is returned (wrapped) by Handshake when the agent speaks
// another protocol major version than this worker.
var ErrVersionMismatch = errors.New("agent protocol version mismatch")

// Hello is what an agent announces when it starts.
type Hello struct {
	Version int     // protocol major version
	Runtime string  // language runtime and version, e.g. "python3.11.7"
	Pid     int     // the agent's process id in its own pid namespace
	Role    string  // templates and forked instances: see Header.Role
	WarmMS  float64 // a runtime template's warm-up time
	// HostPid is the agent's pid in the worker's PID namespace, from the
	// kernel's credentials on the hello (HandshakeForked only).
	HostPid int
}

// InitParams tell an agent which code to load and the Lambda-style identity
// the handler sees in its context object.
type InitParams struct {
	Function string
	Version  int // function version; 0 shows as "$LATEST"
	Handler  string
	MemoryMB int
	Timeout  time.Duration // used for the deadline of an invoke that carries none
	ARN      string
	LogGroup string
	// LogStream is context.log_stream_name; when empty the agent derives a
	// Lambda-style "YYYY/MM/DD/[version]<random hex>".
	LogStream string
	CodeDir   string // directory put first on the module path; "/var/task" when empty
}

// InvokeParams describe one call.
type InvokeParams struct {
	ID      string // call id; context.aws_request_id
	Payload []byte // event JSON; empty means {}
	// Deadline is what context.get_remaining_time_in_millis counts down
	// to. When zero, the ctx deadline is used, and failing that the
	// agent's now + InitParams.Timeout.
	Deadline time.Time
	TraceID  string // exported to the handler as _X_AMZN_TRACE_ID
	// CheckpointListen, when set, lets the worker checkpoint the call
	// while it runs (see CheckpointSignal): the agent then listens on this
	// socket path, inside the instance, for the restoring worker.
	CheckpointListen string
}

// CheckpointSignal asks an agent whose call runs with CheckpointListen to
// hand the call over for a checkpoint. Its answer arrives on the call's
// Invoke, which then returns a *Checkpointed error.
const CheckpointSignal = syscall.SIGUSR2

// Checkpointed is the error Invoke returns when the agent handed the
// running call over for a checkpoint: the agent has closed its socket and
// waits, quiescent, on the call's CheckpointListen path. Dump the instance
// now; whoever restores it connects there and collects the result with
// AfterRestore and Await. The Client is closed.
type Checkpointed struct {
	CallID string
	RSS    int64         // the agent's resident bytes at the hand-over
	Defers int           // times the agent deferred (it held a socket)
	Reason string        // the last deferral's reason
	Wait   time.Duration // from the first deferral to the hand-over
}

func (e *Checkpointed) Error() string {
	return "call " + e.CallID + " handed over for a checkpoint"
}

// LogRecord is a chunk of output an instance wrote to stdout or stderr.
// Chunks follow pipe reads, not lines: a line may span two records.
type LogRecord struct {
	CallID string // the call that was running, "" outside calls (e.g. during init)
	Stream string // StreamStdout or StreamStderr
	Data   []byte // owned by the receiver
}

// InitError is returned by Client.Init when the function's code failed to
// load: missing module or handler, syntax error, or an exception raised at
// import time. The instance is still alive but useless; discard it.
type InitError struct {
	Err function.Error
}

func (e *InitError) Error() string {
	var b strings.Builder
	b.WriteString("function init failed: ")
	b.WriteString(e.Err.ErrorType)
	b.WriteString(": ")
	b.WriteString(e.Err.ErrorMessage)
	if len(e.Err.StackTrace) > 0 {
		b.WriteString("\nTraceback:\n")
		for _, line := range e.Err.StackTrace {
			b.WriteString(line)
			if !strings.HasSuffix(line, "\n") {
				b.WriteByte('\n')
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}
