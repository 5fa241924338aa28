// Package function defines the data model shared by every role: a function's
// spec and versions, call records, invocation requests and results, and log
// lines. It validates user input but does no I/O and must not import any
// other torpor package except errdefs.
package function

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Limits a user can run into. They follow AWS Lambda where Lambda has one.
const (
	MaxPayloadBytes   = 6 << 20   // request and response payload (Lambda: 6 MB)
	MaxCodeZipBytes   = 50 << 20  // zipped code package (Lambda direct upload: 50 MB)
	MaxCodeUnzipBytes = 250 << 20 // unzipped code (Lambda: 250 MB)
	MinMemoryMB       = 64
	MaxMemoryMB       = 10240
	DefaultMemoryMB   = 128
	DefaultTimeout    = 3 * time.Second // Lambda's default
	MaxTimeout        = 15 * time.Minute
	MaxConcurrency    = 1000
)

// Runtimes torpor can run. The key is what users pass to --runtime.
var Runtimes = map[string]bool{"python3": true}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
var handlerRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\.[A-Za-z_][A-Za-z0-9_]*$`)
var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateName reports whether name is a legal function name.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid(fmt.Sprintf("invalid function name %q: use 1-64 characters from [A-Za-z0-9_-]", name))
	}
	return nil
}

// Spec is what a user deploys, apart from the code.
type Spec struct {
	Name        string            `json:"name"`
	Runtime     string            `json:"runtime"`
	Handler     string            `json:"handler"`
	MemoryMB    int               `json:"memory_mb"`
	TimeoutSec  float64           `json:"timeout_s"`
	Env         map[string]string `json:"env,omitempty"`
	Concurrency int               `json:"concurrency,omitempty"` // max parallel instances; 0 = no limit
	// MaxDurationSec, when longer than TimeoutSec, lets a call run that
	// long in all: each slice of TimeoutSec ends with a checkpoint, and
	// the call resumes from it, on this worker or another (R-Check's time
	// limits). 0 means TimeoutSec.
	MaxDurationSec float64 `json:"max_duration_s,omitempty"`
}

// MaxMaxDuration bounds MaxDurationSec.
const MaxMaxDuration = 24 * time.Hour

// MaxDuration is the total run time a call may have, across slices.
func (s Spec) MaxDuration() time.Duration {
	if s.MaxDurationSec > s.TimeoutSec {
		return time.Duration(s.MaxDurationSec * float64(time.Second))
	}
	return s.Timeout()
}

// Sliced reports whether calls run in several slices (MaxDuration > Timeout).
func (s Spec) Sliced() bool { return s.MaxDurationSec > s.TimeoutSec }

// Timeout returns the spec's timeout as a duration.
func (s Spec) Timeout() time.Duration { return time.Duration(s.TimeoutSec * float64(time.Second)) }

// Normalize fills defaults and validates the spec.
func (s *Spec) Normalize() error {
	if err := ValidateName(s.Name); err != nil {
		return err
	}
	if s.Runtime == "" {
		s.Runtime = "python3"
	}
	if !Runtimes[s.Runtime] {
		return errdefs.Invalid(fmt.Sprintf("unsupported runtime %q: use one of %s", s.Runtime, strings.Join(runtimeNames(), ", ")))
	}
	if !handlerRE.MatchString(s.Handler) {
		return errdefs.Invalid(fmt.Sprintf("invalid handler %q: use MODULE.FUNCTION, e.g. app.handler", s.Handler))
	}
	if s.MemoryMB == 0 {
		s.MemoryMB = DefaultMemoryMB
	}
	if s.MemoryMB < MinMemoryMB || s.MemoryMB > MaxMemoryMB {
		return errdefs.Invalid(fmt.Sprintf("memory %d MB out of range: use %d-%d MB", s.MemoryMB, MinMemoryMB, MaxMemoryMB))
	}
	if s.TimeoutSec == 0 {
		s.TimeoutSec = DefaultTimeout.Seconds()
	}
	if !(s.TimeoutSec >= 0.1 && s.TimeoutSec <= MaxTimeout.Seconds()) { // also rejects NaN and ±Inf
		return errdefs.Invalid(fmt.Sprintf("timeout %gs out of range: use 0.1-%g seconds", s.TimeoutSec, MaxTimeout.Seconds()))
	}
	if s.MaxDurationSec != 0 && !(s.MaxDurationSec >= s.TimeoutSec && s.MaxDurationSec <= MaxMaxDuration.Seconds()) {
		return errdefs.Invalid(fmt.Sprintf("max duration %gs out of range: use 0 (same as the timeout) or %g-%g seconds; each slice of a call is at most the timeout, %gs",
			s.MaxDurationSec, s.TimeoutSec, MaxMaxDuration.Seconds(), s.TimeoutSec))
	}
	if s.Concurrency < 0 || s.Concurrency > MaxConcurrency {
		return errdefs.Invalid(fmt.Sprintf("concurrency %d out of range: use 0 (no limit) to %d", s.Concurrency, MaxConcurrency))
	}
	for k := range s.Env {
		if !envKeyRE.MatchString(k) {
			return errdefs.Invalid(fmt.Sprintf("invalid environment variable name %q: use [A-Za-z_][A-Za-z0-9_]*", k))
		}
		if strings.HasPrefix(k, "TORPOR_") || strings.HasPrefix(k, "AWS_LAMBDA_") {
			return errdefs.Invalid(fmt.Sprintf("environment variable %q is reserved: pick a name without the TORPOR_ or AWS_LAMBDA_ prefix", k))
		}
	}
	return nil
}

func runtimeNames() []string {
	var out []string
	for k := range Runtimes {
		out = append(out, k)
	}
	return out
}

// Version is one immutable deployed version of a function.
type Version struct {
	Spec
	Version    int       `json:"version"`
	CodeDigest string    `json:"code_sha256"` // hex sha256 of the code zip; key of the code blob
	CodeSize   int64     `json:"code_size"`
	UID        int       `json:"uid"` // sandbox uid dedicated to the function (stable across versions)
	CreatedAt  time.Time `json:"created_at"`
}

// ARN returns the Lambda-style ARN used in context.invoked_function_arn.
func (v Version) ARN() string {
	return "arn:aws:lambda:torpor:000000000000:function:" + v.Name
}

// Call states.
const (
	StatusQueued    = "queued"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed" // the handler raised, timed out, ran out of memory or crashed
	StatusMoving    = "moving" // checkpointed, waiting for a worker to restore it
)

// Outcomes of an attempt besides succeeded and failed.
const (
	OutcomeLost         = "lost"         // its worker died without a checkpoint: the call runs again from the start
	OutcomeCheckpointed = "checkpointed" // it left its worker as a snapshot: the next attempt resumes it
)

// Reasons an attempt ended early.
const (
	ReasonEviction = "eviction" // its worker was being evicted
	ReasonSlice    = "slice"    // the slice (the timeout) ended before the call's max duration
	ReasonCrash    = "crash"    // its worker died without a checkpoint (outcome lost)
	// ReasonCheckpointFailed: a checkpoint of the call failed and took its
	// process with it (outcome lost); it runs again from the start.
	ReasonCheckpointFailed = "checkpoint-failed"
)

// Start paths: how the instance that served a call was obtained.
const (
	StartHot     = "hot"     // an idle instance was reused
	StartWarm    = "warm"    // forked from a function template
	StartCold    = "cold"    // a new instance was started and the code imported
	StartRestore = "restore" // restored from a snapshot
	StartResume  = "resume"  // a call's own checkpoint, restored to finish it
)

// Error is the Lambda-shaped error a failed call returns.
type Error struct {
	ErrorMessage string   `json:"errorMessage"`
	ErrorType    string   `json:"errorType"`
	StackTrace   []string `json:"stackTrace,omitempty"`
}

func (e *Error) Error() string { return e.ErrorType + ": " + e.ErrorMessage }

// Attempt records one execution attempt of a call.
type Attempt struct {
	Worker     string    `json:"worker"`
	Start      string    `json:"start,omitempty"` // hot|warm|cold|restore
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Outcome    string    `json:"outcome,omitempty"` // succeeded|failed|lost|checkpointed

	// A call that moves between workers (eviction, slice end) leaves one
	// attempt per hop. An attempt that ended "checkpointed" left as
	// Snapshot; the next one started from it ("restore").
	Reason       string  `json:"reason,omitempty"`        // why it ended early: eviction|slice|crash
	Snapshot     string  `json:"snapshot,omitempty"`      // the image this attempt left as, or started from
	RunMS        float64 `json:"run_ms,omitempty"`        // handler time in this attempt
	CheckpointMS float64 `json:"checkpoint_ms,omitempty"` // from the hand-over request until the image was stored
	ImageBytes   int64   `json:"image_bytes,omitempty"`   // stored (compressed) size of the image
	RestoreMS    float64 `json:"restore_ms,omitempty"`    // fetching, verifying and restoring the image
}

// Call is the durable record of one invocation.
type Call struct {
	ID         string          `json:"id"`
	Function   string          `json:"function"`
	Version    int             `json:"version"`
	Mode       string          `json:"mode"` // sync|async
	Status     string          `json:"status"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt time.Time       `json:"finished_at,omitzero"`
	DurationMS float64         `json:"duration_ms,omitempty"` // handler time of the final attempt
	Attempts   []Attempt       `json:"attempts,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      *Error          `json:"error,omitempty"`
}

// InvokeRequest asks for one call of a function.
type InvokeRequest struct {
	Function string
	Version  int    // 0 = latest
	CallID   string // assigned by the dispatcher when empty
	Payload  []byte // JSON event
	LogTail  bool   // return the last 4 KB of the call's logs
	// Attempt counts the times the call was sent to a worker: above 1, an
	// earlier worker died running it and it runs again from the start.
	Attempt int
}

// InvokeResult is the outcome of a call that ran. A handler failure is a
// result with Err set, not a Go error: Go errors mean the platform could not
// run the call at all.
type InvokeResult struct {
	CallID    string
	Version   int
	Payload   []byte // the handler's JSON result when Err is nil
	Err       *Error
	Start     string
	StartTime time.Duration // time spent obtaining the instance
	Duration  time.Duration // time spent in the handler
	LogTail   []byte
}

// LogLine is one line a function printed, or a platform line (START/END/REPORT).
type LogLine struct {
	Time     time.Time `json:"ts"`
	Function string    `json:"fn"`
	Version  int       `json:"version"`
	CallID   string    `json:"call,omitempty"`
	Stream   string    `json:"stream"` // stdout|stderr|platform
	Text     string    `json:"text"`
}

// callIDClock makes call ids strictly increasing within this process: the
// 12-bit rand_a field counts calls within one millisecond (RFC 9562 §6.2,
// method 1).
var callIDClock struct {
	sync.Mutex
	ms  uint64
	seq uint16
}

// NewCallID returns a UUIDv7: time-ordered, so sorting ids sorts calls by
// arrival, and shaped like a Lambda request id.
func NewCallID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	ms := uint64(time.Now().UnixMilli())
	callIDClock.Lock()
	if ms <= callIDClock.ms {
		ms = callIDClock.ms
		callIDClock.seq++
		if callIDClock.seq > 0xfff { // 4096 ids in one ms: borrow the next ms
			ms++
			callIDClock.seq = 0
		}
	} else {
		callIDClock.seq = uint16(b[6])<<8&0x700 | uint16(b[7]) // random start, headroom to count up
	}
	callIDClock.ms = ms
	seq := callIDClock.seq
	callIDClock.Unlock()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6], b[7] = byte(seq>>8), byte(seq)
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

var callIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidateCallID reports whether id is shaped like a call id.
func ValidateCallID(id string) error {
	if !callIDRE.MatchString(id) {
		return errdefs.Invalid(fmt.Sprintf("invalid call id %q: expected a UUID such as the X-Torpor-Call-Id of a response", id))
	}
	return nil
}
