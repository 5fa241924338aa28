package callmsg

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Header names of a resume message.
const (
	HSnapshot = "Torpor-Snapshot"
	HMode     = "Torpor-Mode"
	HReplyTo  = "Torpor-Reply-To"
	HElapsed  = "Torpor-Elapsed-Us"
	HHop      = "Torpor-Hop"
	HReason   = "Torpor-Reason"
	HFrom     = "Torpor-From"
	// HWorker names the worker a request is for, where worker ids that
	// differ only in characters a subject token cannot hold share a
	// subject (eviction requests).
	HWorker = "Torpor-Worker"
)

// Resume is a call that left its worker as a snapshot while it ran (an
// eviction, the end of a slice): whichever worker takes the message
// restores the snapshot and collects the call's outcome.
type Resume struct {
	// Req is the call as it was first asked for. Its Payload travels
	// too: should the snapshot be unusable, the call runs again from the
	// start (and its record says so).
	Req      function.InvokeRequest
	Snapshot string
	Mode     string        // sync|async
	ReplyTo  string        // sync: the NATS subject the caller waits on
	Created  time.Time     // when the call was accepted
	Elapsed  time.Duration // handler time of the call so far, across hops
	Hop      int           // 1 for the first move
	Reason   string        // function.ReasonEviction or ReasonSlice
	From     string        // the worker it left
}

// MsgID is the JetStream de-duplication id of r: one message per
// checkpoint. (A hop number would not do: a call restored twice from one
// checkpoint, after a crash, reaches the same hop again with another.)
func (r Resume) MsgID() string { return "resume-" + r.Req.CallID + "-" + r.Snapshot }

// ResumeMsg encodes r for subject.
func ResumeMsg(subject string, r Resume) *nats.Msg {
	m := Request(subject, r.Req)
	m.Header.Set(HSnapshot, r.Snapshot)
	m.Header.Set(HMode, r.Mode)
	if r.ReplyTo != "" {
		m.Header.Set(HReplyTo, r.ReplyTo)
	}
	m.Header.Set(HCreated, r.Created.UTC().Format(time.RFC3339Nano))
	m.Header.Set(HElapsed, strconv.FormatInt(r.Elapsed.Microseconds(), 10))
	m.Header.Set(HHop, strconv.Itoa(r.Hop))
	m.Header.Set(HReason, r.Reason)
	m.Header.Set(HFrom, r.From)
	return m
}

// IsResume reports whether m is a resume message rather than a call.
func IsResume(m *nats.Msg) bool { return m.Header.Get(HSnapshot) != "" }

// ParseResume decodes a resume message.
func ParseResume(m *nats.Msg) (Resume, error) {
	req, err := ParseRequest(m)
	if err != nil {
		return Resume{}, err
	}
	r := Resume{Req: req, Snapshot: m.Header.Get(HSnapshot), Mode: m.Header.Get(HMode), ReplyTo: m.Header.Get(HReplyTo),
		Reason: m.Header.Get(HReason), From: m.Header.Get(HFrom)}
	us, err1 := strconv.ParseInt(m.Header.Get(HElapsed), 10, 64)
	hop, err2 := strconv.Atoi(m.Header.Get(HHop))
	created, err3 := time.Parse(time.RFC3339Nano, m.Header.Get(HCreated))
	r.Elapsed, r.Hop, r.Created = time.Duration(us)*time.Microsecond, hop, created
	if r.Snapshot == "" || (r.Mode != "sync" && r.Mode != "async") || (r.Mode == "sync" && r.ReplyTo == "") ||
		err1 != nil || err2 != nil || err3 != nil || hop < 1 {
		return r, fmt.Errorf("malformed resume message for call %s on %s: %w", req.CallID, m.Subject, errdefs.ErrInvalid)
	}
	return r, nil
}
