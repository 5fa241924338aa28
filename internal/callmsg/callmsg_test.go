package callmsg

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

func TestRequestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		req  function.InvokeRequest
	}{
		{"basic", function.InvokeRequest{Function: "hello", Version: 3, CallID: "01890a5d-ac96-774b-bcce-b302099a8057",
			Payload: []byte(`{"a":1}`)}},
		{"log tail", function.InvokeRequest{Function: "f", Version: 1, CallID: "c", Payload: []byte(`null`), LogTail: true}},
		{"empty payload", function.InvokeRequest{Function: "f", Version: 0, CallID: "c"}},
		{"binary-ish payload", function.InvokeRequest{Function: "f", Version: 9, CallID: "c", Payload: []byte("\x00\r\n\xff")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Request("torpor.invoke."+tt.req.Function, tt.req)
			if m.Subject != "torpor.invoke."+tt.req.Function {
				t.Errorf("subject = %q", m.Subject)
			}
			got, err := ParseRequest(m)
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if got.Function != tt.req.Function || got.Version != tt.req.Version || got.CallID != tt.req.CallID ||
				got.LogTail != tt.req.LogTail || !bytes.Equal(got.Payload, tt.req.Payload) {
				t.Errorf("round trip = %+v, want %+v", got, tt.req)
			}
		})
	}
}

func TestParseRequestMalformed(t *testing.T) {
	good := func() *nats.Msg {
		return Request("torpor.invoke.f", function.InvokeRequest{Function: "f", Version: 1, CallID: "c"})
	}
	tests := []struct {
		name   string
		mutate func(*nats.Msg)
	}{
		{"no call id", func(m *nats.Msg) { m.Header.Del(HCallID) }},
		{"no function", func(m *nats.Msg) { m.Header.Del(HFunction) }},
		{"no version", func(m *nats.Msg) { m.Header.Del(HVersion) }},
		{"bad version", func(m *nats.Msg) { m.Header.Set(HVersion, "v1") }},
		{"no headers", func(m *nats.Msg) { m.Header = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := good()
			tt.mutate(m)
			_, err := ParseRequest(m)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("ParseRequest = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), "torpor.invoke.f") {
				t.Errorf("error %q does not name the subject", err)
			}
		})
	}
}

func TestReplyRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		res  function.InvokeResult
	}{
		{"ok", function.InvokeResult{CallID: "c1", Version: 2, Payload: []byte(`{"x":"y"}`), Start: function.StartHot,
			StartTime: 1500 * time.Microsecond, Duration: 42 * time.Millisecond}},
		{"ok with log tail", function.InvokeResult{CallID: "c2", Version: 1, Payload: []byte(`1`), Start: function.StartCold,
			StartTime: 120 * time.Millisecond, Duration: time.Second,
			LogTail: []byte("START RequestId: c2\nhello\r\nwörld \x00\nEND RequestId: c2\n")}},
		{"function error", function.InvokeResult{CallID: "c3", Version: 7, Start: function.StartWarm,
			Duration: 3 * time.Microsecond, Err: &function.Error{ErrorType: "ValueError", ErrorMessage: "bad input",
				StackTrace: []string{"  File \"/var/task/app.py\", line 3, in handler\n    raise ValueError\n"}}}},
		{"function error without trace", function.InvokeResult{CallID: "c4", Version: 1,
			Err: &function.Error{ErrorType: "Sandbox.Timedout", ErrorMessage: "Task timed out after 3.00 seconds"}}},
		{"zero result", function.InvokeResult{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseReply(Reply(tt.res))
			if err != nil {
				t.Fatalf("ParseReply: %v", err)
			}
			if got.CallID != tt.res.CallID || got.Version != tt.res.Version || got.Start != tt.res.Start ||
				got.StartTime != tt.res.StartTime || got.Duration != tt.res.Duration {
				t.Errorf("metadata = %+v, want %+v", got, tt.res)
			}
			if !bytes.Equal(got.LogTail, tt.res.LogTail) {
				t.Errorf("log tail = %q, want %q", got.LogTail, tt.res.LogTail)
			}
			if tt.res.Err != nil {
				if !reflect.DeepEqual(got.Err, tt.res.Err) {
					t.Errorf("Err = %+v, want %+v", got.Err, tt.res.Err)
				}
				if got.Payload != nil {
					t.Errorf("a function error carries payload %q", got.Payload)
				}
				return
			}
			if got.Err != nil {
				t.Errorf("Err = %+v, want nil", got.Err)
			}
			if !bytes.Equal(got.Payload, tt.res.Payload) {
				t.Errorf("payload = %q, want %q", got.Payload, tt.res.Payload)
			}
		})
	}
}

// Timings travel in whole microseconds.
func TestReplyTimingsTruncateToMicroseconds(t *testing.T) {
	got, err := ParseReply(Reply(function.InvokeResult{StartTime: 1999 * time.Nanosecond, Duration: 2*time.Millisecond + 999}))
	if err != nil {
		t.Fatal(err)
	}
	if got.StartTime != time.Microsecond || got.Duration != 2*time.Millisecond {
		t.Errorf("StartTime, Duration = %s, %s; want 1µs, 2ms", got.StartTime, got.Duration)
	}
}

func TestErrorReplyKeepsClass(t *testing.T) {
	classes := []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrConflict, errdefs.ErrUnavailable,
		errdefs.ErrTooLarge, errdefs.ErrTimeout, errdefs.ErrThrottled}
	for _, class := range classes {
		t.Run(class.Error(), func(t *testing.T) {
			sent := fmt.Errorf("run call c of f: %w", class)
			_, err := ParseReply(ErrorReply(sent))
			if err == nil {
				t.Fatal("ParseReply of a platform error returned nil")
			}
			if !errors.Is(err, class) {
				t.Errorf("errors.Is(%q, %v) = false", err, class)
			}
			for _, other := range classes {
				if other != class && errors.Is(err, other) {
					t.Errorf("error of class %v also matches %v", class, other)
				}
			}
			if err.Error() != sent.Error() {
				t.Errorf("message = %q, want %q", err, sent)
			}
		})
	}
	t.Run("classed helpers", func(t *testing.T) {
		for _, sent := range []error{errdefs.NotFound("function x not found"), errdefs.Invalid("bad"), errdefs.TooLarge("big")} {
			_, err := ParseReply(ErrorReply(sent))
			if err == nil || err.Error() != sent.Error() {
				t.Fatalf("ParseReply = %v, want %q", err, sent)
			}
			for _, c := range classes {
				if errors.Is(sent, c) != errors.Is(err, c) {
					t.Errorf("%q: class %v not preserved", sent, c)
				}
			}
		}
	})
	t.Run("unclassed", func(t *testing.T) {
		_, err := ParseReply(ErrorReply(errors.New("disk on fire")))
		if err == nil || err.Error() != "disk on fire" {
			t.Fatalf("ParseReply = %v", err)
		}
		for _, c := range classes {
			if errors.Is(err, c) {
				t.Errorf("unclassed error matches %v", c)
			}
		}
	})
}

func TestParseReplyMalformed(t *testing.T) {
	tests := []struct {
		name      string
		msg       func() *nats.Msg
		wantClass error  // nil: any error
		wantText  string // substring
	}{
		{"empty message means no worker answered", func() *nats.Msg { return nats.NewMsg("") },
			errdefs.ErrUnavailable, "no worker answered"},
		{"nil header and data", func() *nats.Msg { return &nats.Msg{} }, errdefs.ErrUnavailable, "no worker answered"},
		{"unknown outcome", func() *nats.Msg {
			m := nats.NewMsg("")
			m.Header.Set(HOutcome, "maybe")
			return m
		}, nil, `"maybe"`},
		{"data without outcome", func() *nats.Msg {
			m := nats.NewMsg("")
			m.Data = []byte("hello")
			return m
		}, nil, "malformed reply"},
		{"function error with bad json", func() *nats.Msg {
			m := nats.NewMsg("")
			m.Header.Set(HOutcome, OutcomeFunctionError)
			m.Data = []byte("{not json")
			return m
		}, nil, "malformed function error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseReply(tt.msg())
			if err == nil {
				t.Fatal("ParseReply = nil error")
			}
			if tt.wantClass != nil && !errors.Is(err, tt.wantClass) {
				t.Errorf("error %q is not %v", err, tt.wantClass)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not contain %q", err, tt.wantText)
			}
		})
	}
}

// Bad numeric headers are tolerated (treated as zero) rather than failing a
// call that ran.
func TestParseReplyToleratesBadNumbers(t *testing.T) {
	m := Reply(function.InvokeResult{CallID: "c", Version: 1, Payload: []byte("1")})
	m.Header.Set(HVersion, "x")
	m.Header.Set(HDurUS, "y")
	m.Header.Set(HLogTail, "%%%not base64")
	res, err := ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != 0 || res.Duration != 0 || string(res.Payload) != "1" {
		t.Errorf("res = %+v", res)
	}
}

func TestDropRoundTrip(t *testing.T) {
	for _, d := range []Drop{
		{Function: "fn"},
		{Function: "fn", Version: 3},
		{Function: "fn", Version: 2, KeepTemplates: true},
	} {
		got, err := ParseDrop(DropRequest("torpor.workers.drop", d))
		if err != nil || got != d {
			t.Errorf("ParseDrop(DropRequest(%+v)) = %+v, %v", d, got, err)
		}
	}
	for name, mutate := range map[string]func(*nats.Msg){
		"no function":      func(m *nats.Msg) { m.Header.Del(HFunction) },
		"bad version":      func(m *nats.Msg) { m.Header.Set(HVersion, "x") },
		"negative version": func(m *nats.Msg) { m.Header.Set(HVersion, "-1") },
		"no headers":       func(m *nats.Msg) { m.Header = nil },
	} {
		m := DropRequest("torpor.workers.drop", Drop{Function: "fn", Version: 1})
		mutate(m)
		if _, err := ParseDrop(m); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: ParseDrop = %v, want ErrInvalid", name, err)
		}
	}
}
