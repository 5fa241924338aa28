// Package callmsg is the NATS message format between the dispatcher (gateway
// side) and workers: call requests, their replies, deploy validation, and
// the operator's drop requests.
// Payloads travel as raw message bodies, metadata as headers, so a 6 MB event
// is never re-encoded. It does no I/O.
package callmsg

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Header names.
const (
	HCallID   = "Torpor-Call-Id"
	HFunction = "Torpor-Function"
	HVersion  = "Torpor-Version"
	HLogTail  = "Torpor-Log-Tail"
	HOutcome  = "Torpor-Outcome"
	HStart    = "Torpor-Start"
	HStartUS  = "Torpor-Start-Us"
	HDurUS    = "Torpor-Duration-Us"
	HClass    = "Torpor-Error-Class"
	HCreated  = "Torpor-Created"
	HKeepTpl  = "Torpor-Keep-Templates"
	HAttempt  = "Torpor-Attempt"
)

// Progress notes a worker sends on a sync call's reply subject before its
// outcome (Note): who runs the call now, and when it has moved into the
// durable queue. The dispatcher re-runs a call whose worker died without
// a checkpoint (at least once), or abandoned it, and never one that moved.
const (
	OutcomeRunning   = "running"   // HWorker runs the call
	OutcomeMoving    = "moving"    // the call left its worker as a checkpoint and waits in the durable queue
	OutcomeAbandoned = "abandoned" // HWorker stopped the call unfinished and without a checkpoint (an eviction's grace ran out)
)

// Errors of a worker in the caller's own process (dispatch.Local) for a
// call it did not finish and that runs again elsewhere; a worker over NATS
// says the same with an abandoned note, or an error reply before it starts.
var (
	// ErrAbandoned: the worker gave the call up unfinished and without a
	// checkpoint (AbandonReason says why).
	ErrAbandoned = errors.New("abandoned by its worker before it ended, without a checkpoint")
	// ErrClosing: the worker is closing and did not start the call.
	ErrClosing = errors.New("the worker is closing")
)

// AbandonReason is why the call of err (ErrAbandoned) was given up, a
// function.Reason*: what err's AbandonReason method says, else
// function.ReasonEviction.
func AbandonReason(err error) string {
	var r interface{ AbandonReason() string }
	if errors.As(err, &r) {
		return r.AbandonReason()
	}
	return function.ReasonEviction
}

// Note encodes a progress note.
func Note(outcome, worker string) *nats.Msg {
	m := nats.NewMsg("")
	m.Header.Set(HOutcome, outcome)
	m.Header.Set(HWorker, worker)
	return m
}

// IsNote reports whether m is a progress note rather than an outcome.
func IsNote(m *nats.Msg) bool {
	o := m.Header.Get(HOutcome)
	return o == OutcomeRunning || o == OutcomeMoving || o == OutcomeAbandoned
}

// Outcomes of a reply.
const (
	OutcomeOK            = "ok"
	OutcomeFunctionError = "function-error" // the handler failed; body is a function.Error
	OutcomePlatformError = "platform-error" // torpor could not run the call; body is a message
)

// Request encodes an invocation for subject.
func Request(subject string, req function.InvokeRequest) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(HCallID, req.CallID)
	m.Header.Set(HFunction, req.Function)
	m.Header.Set(HVersion, strconv.Itoa(req.Version))
	if req.LogTail {
		m.Header.Set(HLogTail, "1")
	}
	if req.Attempt > 1 {
		m.Header.Set(HAttempt, strconv.Itoa(req.Attempt))
	}
	m.Data = req.Payload
	return m
}

// ParseRequest decodes an invocation.
func ParseRequest(m *nats.Msg) (function.InvokeRequest, error) {
	v, err := strconv.Atoi(m.Header.Get(HVersion))
	req := function.InvokeRequest{
		CallID: m.Header.Get(HCallID), Function: m.Header.Get(HFunction), Version: v,
		Payload: m.Data, LogTail: m.Header.Get(HLogTail) == "1",
	}
	req.Attempt, _ = strconv.Atoi(m.Header.Get(HAttempt))
	if err != nil || req.CallID == "" || req.Function == "" {
		return req, fmt.Errorf("malformed call message on %s: %w", m.Subject, errdefs.ErrInvalid)
	}
	return req, nil
}

// Drop asks workers to stop the idle instances of a function (version 0:
// of every version) and, unless KeepTemplates, its function templates.
type Drop struct {
	Function      string
	Version       int
	KeepTemplates bool
}

// DropRequest encodes d for subject.
func DropRequest(subject string, d Drop) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(HFunction, d.Function)
	m.Header.Set(HVersion, strconv.Itoa(d.Version))
	if d.KeepTemplates {
		m.Header.Set(HKeepTpl, "1")
	}
	return m
}

// ParseDrop decodes a drop request.
func ParseDrop(m *nats.Msg) (Drop, error) {
	v, err := strconv.Atoi(m.Header.Get(HVersion))
	d := Drop{Function: m.Header.Get(HFunction), Version: v, KeepTemplates: m.Header.Get(HKeepTpl) == "1"}
	if err != nil || d.Function == "" || v < 0 {
		return d, fmt.Errorf("malformed drop request on %s: %w", m.Subject, errdefs.ErrInvalid)
	}
	return d, nil
}

// Reply encodes the outcome of a call that ran.
func Reply(res function.InvokeResult) *nats.Msg {
	m := nats.NewMsg("")
	m.Header.Set(HCallID, res.CallID)
	m.Header.Set(HVersion, strconv.Itoa(res.Version))
	m.Header.Set(HStart, res.Start)
	m.Header.Set(HStartUS, strconv.FormatInt(res.StartTime.Microseconds(), 10))
	m.Header.Set(HDurUS, strconv.FormatInt(res.Duration.Microseconds(), 10))
	if len(res.LogTail) > 0 {
		m.Header.Set(HLogTail, base64.StdEncoding.EncodeToString(res.LogTail))
	}
	if res.Err != nil {
		m.Header.Set(HOutcome, OutcomeFunctionError)
		m.Data, _ = json.Marshal(res.Err)
	} else {
		m.Header.Set(HOutcome, OutcomeOK)
		m.Data = res.Payload
	}
	return m
}

// classes maps error classes to their wire names.
var classes = []struct {
	name string
	err  error
}{
	{"not-found", errdefs.ErrNotFound}, {"invalid", errdefs.ErrInvalid}, {"conflict", errdefs.ErrConflict},
	{"unavailable", errdefs.ErrUnavailable}, {"too-large", errdefs.ErrTooLarge}, {"timeout", errdefs.ErrTimeout},
	{"throttled", errdefs.ErrThrottled},
}

// ErrorReply encodes a platform error, keeping its errdefs class.
func ErrorReply(err error) *nats.Msg {
	m := nats.NewMsg("")
	m.Header.Set(HOutcome, OutcomePlatformError)
	for _, c := range classes {
		if errors.Is(err, c.err) {
			m.Header.Set(HClass, c.name)
			break
		}
	}
	m.Data = []byte(err.Error())
	return m
}

// ParseReply decodes a worker's reply. A platform error comes back as a Go
// error of the same errdefs class.
func ParseReply(m *nats.Msg) (function.InvokeResult, error) {
	var res function.InvokeResult
	switch m.Header.Get(HOutcome) {
	case OutcomeOK:
		res.Payload = m.Data
	case OutcomeFunctionError:
		res.Err = &function.Error{}
		if err := json.Unmarshal(m.Data, res.Err); err != nil {
			return res, fmt.Errorf("malformed function error from worker: %w", err)
		}
	case OutcomePlatformError:
		class := m.Header.Get(HClass)
		for _, c := range classes {
			if c.name == class {
				return res, &remoteError{msg: string(m.Data), class: c.err}
			}
		}
		return res, errors.New(string(m.Data))
	default:
		if len(m.Header) == 0 && len(m.Data) == 0 {
			return res, fmt.Errorf("no worker answered: %w", errdefs.ErrUnavailable)
		}
		return res, fmt.Errorf("malformed reply from worker (outcome %q)", m.Header.Get(HOutcome))
	}
	res.CallID = m.Header.Get(HCallID)
	res.Version, _ = strconv.Atoi(m.Header.Get(HVersion))
	res.Start = m.Header.Get(HStart)
	us, _ := strconv.ParseInt(m.Header.Get(HStartUS), 10, 64)
	res.StartTime = time.Duration(us) * time.Microsecond
	us, _ = strconv.ParseInt(m.Header.Get(HDurUS), 10, 64)
	res.Duration = time.Duration(us) * time.Microsecond
	if t := m.Header.Get(HLogTail); t != "" {
		res.LogTail, _ = base64.StdEncoding.DecodeString(t)
	}
	return res, nil
}

type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string        { return e.msg }
func (e *remoteError) Is(target error) bool { return target == e.class }
