package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/testenv"
)

// TestAgentConformance runs every agent in agentsUnderTest through the
// protocol as the worker uses it. Each case gets a fresh agent process.
func TestAgentConformance(t *testing.T) {
	for _, a := range agentsUnderTest {
		t.Run(a.name, func(t *testing.T) {
			argv := a.cmd(t)
			for _, tc := range conformanceCases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.run(t, spawnAgent(t, argv))
				})
			}
		})
	}
}

type conformanceCase struct {
	name string
	run  func(t *testing.T, p *agentProc)
}

const echoHandler = `
def handler(event, context):
    return event
`

// initParams returns the InitParams the cases use, for code in dir.
func initParams(dir string) InitParams {
	return InitParams{
		Function: "fn",
		Version:  3,
		Handler:  "app.handler",
		MemoryMB: 256,
		Timeout:  30 * time.Second,
		ARN:      "arn:aws:lambda:torpor:000000000000:function:fn",
		LogGroup: "/aws/lambda/fn",
		CodeDir:  dir,
	}
}

// ready handshakes and inits p with app.py = code.
func ready(t *testing.T, p *agentProc, code string) {
	t.Helper()
	ctx := testenv.Ctx(t)
	if _, err := p.client.Handshake(ctx); err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	dir := writeCode(t, map[string]string{"app.py": code})
	if _, err := p.client.Init(ctx, initParams(dir), nil); err != nil {
		t.Fatalf("Init: %v", err)
	}
}

// invokeOK invokes and fails t unless the handler returned a result.
func invokeOK(t *testing.T, p *agentProc, id, payload string, onLog func(LogRecord)) []byte {
	t.Helper()
	res, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: id, Payload: []byte(payload), Deadline: time.Now().Add(30 * time.Second)}, onLog)
	if err != nil {
		t.Fatalf("Invoke %s: %v", id, err)
	}
	if ferr != nil {
		t.Fatalf("Invoke %s: handler failed: %s: %s\n%s", id, ferr.ErrorType, ferr.ErrorMessage, strings.Join(ferr.StackTrace, ""))
	}
	return res
}

var conformanceCases = []conformanceCase{
	{"hello", func(t *testing.T, p *agentProc) {
		h, err := p.client.Handshake(testenv.Ctx(t))
		if err != nil {
			t.Fatalf("Handshake: %v", err)
		}
		if h.Version != Version || h.Pid != p.cmd.Process.Pid || h.Runtime == "" {
			t.Fatalf("hello = %+v, want v%d, pid %d, a runtime", h, Version, p.cmd.Process.Pid)
		}
		t.Logf("hello: %+v", h)
	}},

	{"init ok", func(t *testing.T, p *agentProc) {
		ctx := testenv.Ctx(t)
		if _, err := p.client.Handshake(ctx); err != nil {
			t.Fatal(err)
		}
		dir := writeCode(t, map[string]string{
			"app.py":          "from lib.util import twice\n\ndef handler(event, context):\n    return twice(event['n'])\n",
			"lib/__init__.py": "",
			"lib/util.py":     "def twice(n):\n    return 2 * n\n",
		})
		d, err := p.client.Init(ctx, initParams(dir), nil)
		if err != nil {
			t.Fatalf("Init: %v", err)
		}
		if d <= 0 || d > 10*time.Second {
			t.Errorf("init duration %v out of range", d)
		}
		if got := invokeOK(t, p, "c1", `{"n": 21}`, nil); string(got) != "42" {
			t.Fatalf("result = %s, want 42", got)
		}
	}},

	{"init errors", func(t *testing.T, p *agentProc) {
		// One agent per init; this case spawns its own for each row.
		argv := p.cmd.Args
		tests := []struct {
			name      string
			handler   string
			files     map[string]string
			wantType  string
			wantMsg   string   // exact, or prefix when it ends in "*"
			wantTrace []string // substrings of the joined stack trace
		}{
			{"missing module", "app.handler", map[string]string{"other.py": ""},
				"Runtime.ImportModuleError", "Unable to import module 'app': No module named 'app'", nil},
			{"missing dependency", "app.handler", map[string]string{"app.py": "import torpor_no_such_dep\n"},
				"Runtime.ImportModuleError", "Unable to import module 'app': No module named 'torpor_no_such_dep'", []string{`app.py", line 1, in <module>`}},
			{"missing handler", "app.handler", map[string]string{"app.py": "def other(e, c):\n    pass\n"},
				"Runtime.HandlerNotFound", "Handler 'handler' missing on module 'app'", nil},
			{"syntax error", "app.handler", map[string]string{"app.py": "import os\n\ndef handler(event, context)\n    return 1\n"},
				"Runtime.UserCodeSyntaxError", "Syntax error in module 'app': *", []string{`app.py", line 3`, "def handler(event, context)"}},
			{"exception at import", "app.handler", map[string]string{"app.py": "import os\n\nraise RuntimeError('no config: ' + 'X')\n"},
				"RuntimeError", "no config: X", []string{`app.py", line 3, in <module>`, "raise RuntimeError"}},
			{"malformed handler", "handler", map[string]string{"app.py": ""},
				"Runtime.MalformedHandlerName", "Bad handler 'handler': *", nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				q := spawnAgent(t, argv)
				ctx := testenv.Ctx(t)
				if _, err := q.client.Handshake(ctx); err != nil {
					t.Fatal(err)
				}
				ip := initParams(writeCode(t, tt.files))
				ip.Handler = tt.handler
				_, err := q.client.Init(ctx, ip, nil)
				var ie *InitError
				if !errors.As(err, &ie) {
					t.Fatalf("Init error = %v, want *InitError", err)
				}
				if ie.Err.ErrorType != tt.wantType {
					t.Errorf("errorType = %q, want %q", ie.Err.ErrorType, tt.wantType)
				}
				if want, ok := strings.CutSuffix(tt.wantMsg, "*"); ok && !strings.HasPrefix(ie.Err.ErrorMessage, want) || !ok && ie.Err.ErrorMessage != tt.wantMsg {
					t.Errorf("errorMessage = %q, want %q", ie.Err.ErrorMessage, tt.wantMsg)
				}
				trace := strings.Join(ie.Err.StackTrace, "")
				for _, w := range tt.wantTrace {
					if !strings.Contains(trace, w) {
						t.Errorf("stackTrace does not contain %q:\n%s", w, trace)
					}
				}
				if strings.Contains(trace, "torpor_agent") || strings.Contains(trace, "<frozen") {
					t.Errorf("stackTrace shows agent/importlib frames:\n%s", trace)
				}
				if !strings.Contains(ie.Error(), tt.wantType) || (len(ie.Err.StackTrace) > 0 && !strings.Contains(ie.Error(), strings.TrimSpace(ie.Err.StackTrace[0]))) {
					t.Errorf("InitError.Error() = %q lacks the type or traceback", ie.Error())
				}
				if tt.name == "syntax error" && !strings.Contains(ie.Err.ErrorMessage, "(app.py, line 3)") {
					t.Errorf("syntax error message %q lacks the location", ie.Err.ErrorMessage)
				}
				if err := q.client.Ping(ctx, nil); err != nil {
					t.Errorf("agent stopped serving after init-error: %v", err)
				}
			})
		}
	}},

	{"module-level output is logged before ready", func(t *testing.T, p *agentProc) {
		ctx := testenv.Ctx(t)
		if _, err := p.client.Handshake(ctx); err != nil {
			t.Fatal(err)
		}
		dir := writeCode(t, map[string]string{"app.py": "import sys, os\nprint('loading')\nsys.stderr.write('warming\\n')\nos.write(1, b'raw-fd\\n')\n" + echoHandler})
		var l logs
		if _, err := p.client.Init(ctx, initParams(dir), l.add); err != nil {
			t.Fatalf("Init: %v", err)
		}
		if got := l.text("", StreamStdout); got != "loading\nraw-fd\n" {
			t.Errorf("init stdout = %q", got)
		}
		if got := l.text("", StreamStderr); got != "warming\n" {
			t.Errorf("init stderr = %q", got)
		}
	}},

	{"echo round-trips byte-exact", func(t *testing.T, p *agentProc) {
		ready(t, p, echoHandler)
		big := `{"data": "` + strings.Repeat("x", 5<<20) + `"}`
		for i, payload := range []string{
			`{"a": 1, "b": [true, null, "é ☃ \"q\" \\ \n"], "c": {"d": -0.5, "e": 1e+100}}`,
			`"just a string"`,
			`[]`,
			big,
		} {
			got := invokeOK(t, p, fmt.Sprint("c", i), payload, nil)
			if !bytes.Equal(got, []byte(payload)) {
				t.Errorf("payload %d (%d bytes): result differs (%d bytes): %.80q", i, len(payload), len(got), got)
			}
		}
		if got := invokeOK(t, p, "empty", "", nil); string(got) != "{}" {
			t.Errorf("empty payload: event = %s, want {}", got)
		}
	}},

	{"handler raising", func(t *testing.T, p *agentProc) {
		ready(t, p, "def helper(x):\n    raise ValueError('bad value: %d' % x)\n\ndef handler(event, context):\n    helper(event['x'])\n")
		_, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1", Payload: []byte(`{"x": 7}`)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ferr == nil {
			t.Fatal("no error from a raising handler")
		}
		if ferr.ErrorType != "ValueError" || ferr.ErrorMessage != "bad value: 7" {
			t.Errorf("error = %s: %s", ferr.ErrorType, ferr.ErrorMessage)
		}
		if len(ferr.StackTrace) != 2 {
			t.Fatalf("stackTrace has %d entries, want 2 (handler, helper): %q", len(ferr.StackTrace), ferr.StackTrace)
		}
		for i, want := range []string{`app.py", line 5, in handler` + "\n    helper(event['x'])\n", `app.py", line 2, in helper` + "\n    raise ValueError('bad value: %d' % x)\n"} {
			if !strings.HasPrefix(ferr.StackTrace[i], `  File "`) || !strings.HasSuffix(ferr.StackTrace[i], want) {
				t.Errorf("stackTrace[%d] = %q, want Lambda's format ending %q", i, ferr.StackTrace[i], want)
			}
		}
		if _, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c2", Payload: []byte(`{"x": 8}`)}, nil); err != nil || ferr == nil || ferr.ErrorMessage != "bad value: 8" {
			t.Errorf("second call: err %v, ferr %+v; want the agent still serving", err, ferr)
		}
	}},

	{"output captured per call, before the result", func(t *testing.T, p *agentProc) {
		ready(t, p, `
import os, sys
def handler(event, context):
    print("out-1")
    sys.stderr.write("err-1\n")
    sys.stdout.write("x" * 200000 + "\n")
    os.system("echo from-child; echo child-err 1>&2")
    os.write(1, b"raw-fd-1\n")
    print("out-2", flush=False)
    sys.stdout.write("no-newline")
    return "ok"
`)
		var l logs
		if got := invokeOK(t, p, "call-1", "{}", l.add); string(got) != `"ok"` {
			t.Fatalf("result = %s", got)
		}
		wantOut := "out-1\n" + strings.Repeat("x", 200000) + "\nfrom-child\nraw-fd-1\nout-2\nno-newline"
		if got := l.text("call-1", StreamStdout); got != wantOut {
			t.Errorf("stdout (%d bytes) != want (%d bytes); starts %.40q, ends %q", len(got), len(wantOut), got, got[max(0, len(got)-40):])
		}
		if got := l.text("call-1", StreamStderr); got != "err-1\nchild-err\n" {
			t.Errorf("stderr = %q", got)
		}
		for _, r := range l.all() {
			if r.CallID != "call-1" {
				t.Errorf("record with call id %q during call-1: %q", r.CallID, r.Data)
			}
		}
		// Nothing of call-1 may trail its result.
		var after logs
		if err := p.client.Ping(testenv.Ctx(t), after.add); err != nil {
			t.Fatal(err)
		}
		invokeOK(t, p, "call-2", "{}", after.add)
		for _, r := range after.all() {
			if r.CallID == "call-1" {
				t.Errorf("output of call-1 arrived after its result: %q", r.Data)
			}
		}
		if got := after.text("call-2", StreamStdout); !strings.HasPrefix(got, "out-1\n") {
			t.Errorf("call-2 stdout starts %.20q", got)
		}
	}},

	{"oversized error is truncated, not a protocol error", func(t *testing.T, p *agentProc) {
		// 300 distinct frames (repeated ones would be collapsed by format_list).
		var code strings.Builder
		for i := 0; i < 300; i++ {
			fmt.Fprintf(&code, "def f%d():\n    f%d()\n", i, i+1)
		}
		code.WriteString("def f300():\n    raise ValueError('x' * 3000000)\n\ndef handler(event, context):\n    f0()\n")
		ready(t, p, code.String())
		_, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ferr == nil || ferr.ErrorType != "ValueError" || len(ferr.ErrorMessage) > 100<<10 || !strings.Contains(ferr.ErrorMessage, "truncated") {
			t.Fatalf("error type %q, message of %d bytes", ferr.ErrorType, len(ferr.ErrorMessage))
		}
		if n := len(ferr.StackTrace); n < 50 || n > 101 {
			t.Errorf("stackTrace has %d entries, want the trimmed ~101", n)
		}
		if _, _, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c2"}, nil); err != nil {
			t.Fatalf("agent stopped serving: %v", err)
		}
	}},

	{"fork in handler does not disturb the protocol", func(t *testing.T, p *agentProc) {
		ready(t, p, `
import os
def handler(event, context):
    pid = os.fork()
    if pid == 0:
        print("child")
        return "from-child"  # returns into the agent in the child
    os.waitpid(pid, 0)
    return "from-parent"
`)
		var l logs
		for i := 0; i < 2; i++ {
			got := invokeOK(t, p, fmt.Sprint("c", i), "{}", l.add)
			if string(got) != `"from-parent"` {
				t.Fatalf("call %d result = %s", i, got)
			}
		}
		if got := l.text("c0", StreamStdout); got != "child\n" {
			t.Errorf("child output = %q, want it captured", got)
		}
	}},

	{"non-serializable result", func(t *testing.T, p *agentProc) {
		ready(t, p, "def handler(event, context):\n    return {'s': {1, 2}}\n")
		_, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ferr == nil || ferr.ErrorType != "Runtime.MarshalError" || ferr.ErrorMessage != "Unable to marshal response: Object of type set is not JSON serializable" {
			t.Fatalf("error = %+v", ferr)
		}
	}},

	{"context", func(t *testing.T, p *agentProc) {
		ready(t, p, `
import os, time
def handler(event, context):
    r1 = context.get_remaining_time_in_millis()
    time.sleep(0.05)
    r2 = context.get_remaining_time_in_millis()
    return {
        "aws_request_id": context.aws_request_id,
        "function_name": context.function_name,
        "function_version": context.function_version,
        "memory_limit_in_mb": context.memory_limit_in_mb,
        "invoked_function_arn": context.invoked_function_arn,
        "log_group_name": context.log_group_name,
        "log_stream_name": context.log_stream_name,
        "trace": os.environ.get("_X_AMZN_TRACE_ID"),
        "env_fn": os.environ.get("AWS_LAMBDA_FUNCTION_NAME"),
        "r1": r1, "r2": r2,
    }
`)
		deadline := time.Now().Add(10 * time.Second)
		res, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "req-1", Deadline: deadline, TraceID: "Root=1-abc"}, nil)
		if err != nil || ferr != nil {
			t.Fatalf("Invoke: %v %+v", err, ferr)
		}
		var got struct {
			AwsRequestID       string `json:"aws_request_id"`
			FunctionName       string `json:"function_name"`
			FunctionVersion    string `json:"function_version"`
			MemoryLimitInMB    string `json:"memory_limit_in_mb"`
			InvokedFunctionArn string `json:"invoked_function_arn"`
			LogGroupName       string `json:"log_group_name"`
			LogStreamName      string `json:"log_stream_name"`
			Trace              string `json:"trace"`
			EnvFn              string `json:"env_fn"`
			R1, R2             int64
		}
		if err := json.Unmarshal(res, &got); err != nil {
			t.Fatalf("result %s: %v", res, err)
		}
		ip := initParams("")
		if got.AwsRequestID != "req-1" || got.FunctionName != ip.Function || got.FunctionVersion != "3" ||
			got.MemoryLimitInMB != "256" || got.InvokedFunctionArn != ip.ARN || got.LogGroupName != ip.LogGroup ||
			got.Trace != "Root=1-abc" || got.EnvFn != ip.Function {
			t.Errorf("context = %+v", got)
		}
		if !strings.Contains(got.LogStreamName, "/[3]") {
			t.Errorf("log_stream_name = %q, want Lambda's YYYY/MM/DD/[version]id shape", got.LogStreamName)
		}
		if got.R1 > 10000 || got.R1 < 9000 {
			t.Errorf("remaining time at start = %d ms, want just under 10000", got.R1)
		}
		if d := got.R1 - got.R2; d < 45 || d > 2000 {
			t.Errorf("remaining time fell by %d ms across a 50 ms sleep", d)
		}
		// Without an explicit deadline the ctx deadline counts.
		ctx, cancel := context.WithTimeout(testenv.Ctx(t), 5*time.Second)
		defer cancel()
		res, _, err = p.client.Invoke(ctx, InvokeParams{ID: "req-2"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got.Trace = ""
		if err := json.Unmarshal(res, &got); err != nil {
			t.Fatal(err)
		}
		if got.R1 > 5000 || got.R1 < 4000 || got.Trace != "" {
			t.Errorf("with ctx deadline: remaining %d ms, trace %q", got.R1, got.Trace)
		}
	}},

	{"agent exit mid-call", func(t *testing.T, p *agentProc) {
		ready(t, p, "import os\ndef handler(event, context):\n    os._exit(3)\n")
		_, _, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1"}, nil)
		if !errors.Is(err, ErrAgentExited) {
			t.Fatalf("Invoke error = %v, want ErrAgentExited", err)
		}
		if code := p.waitExit(t); code != 3 {
			t.Errorf("exit code %d, want 3", code)
		}
		if _, _, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c2"}, nil); !errors.Is(err, ErrUnusable) {
			t.Errorf("Invoke after exit: %v, want ErrUnusable", err)
		}
	}},

	{"sys.exit in handler ends the instance", func(t *testing.T, p *agentProc) {
		ready(t, p, "import sys\ndef handler(event, context):\n    print('bye')\n    sys.exit(4)\n")
		var l logs
		_, _, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c1"}, l.add)
		if !errors.Is(err, ErrAgentExited) {
			t.Fatalf("Invoke error = %v, want ErrAgentExited", err)
		}
		if code := p.waitExit(t); code != 4 {
			t.Errorf("exit code %d, want 4", code)
		}
		if got := l.text("c1", StreamStdout); got != "bye\n" {
			t.Errorf("output before exit = %q, want it delivered", got)
		}
	}},

	{"ctx timeout returns promptly", func(t *testing.T, p *agentProc) {
		ready(t, p, "import time\ndef handler(event, context):\n    time.sleep(30)\n")
		ctx, cancel := context.WithTimeout(testenv.Ctx(t), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, _, err := p.client.Invoke(ctx, InvokeParams{ID: "c1"}, nil)
		if el := time.Since(start); el > 1500*time.Millisecond {
			t.Errorf("Invoke returned after %v, want ~200ms", el)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Invoke error = %v, want DeadlineExceeded", err)
		}
		if _, _, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "c2"}, nil); !errors.Is(err, ErrUnusable) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Invoke after timeout: %v, want ErrUnusable only", err)
		}
	}},

	{"ctx cancel returns promptly", func(t *testing.T, p *agentProc) {
		ready(t, p, "import time\ndef handler(event, context):\n    time.sleep(30)\n")
		ctx, cancel := context.WithCancel(testenv.Ctx(t))
		time.AfterFunc(150*time.Millisecond, cancel)
		start := time.Now()
		_, _, err := p.client.Invoke(ctx, InvokeParams{ID: "c1"}, nil)
		if el := time.Since(start); el > 1500*time.Millisecond {
			t.Errorf("Invoke returned after %v, want ~150ms", el)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Invoke error = %v, want Canceled", err)
		}
	}},

	{"unknown and template-only messages", func(t *testing.T, p *agentProc) {
		ready(t, p, echoHandler)
		ctx := testenv.Ctx(t)
		for typ, want := range map[string]string{
			"no-such-message": ErrorTypeUnknownMessage,
			TypeFork:          ErrorTypeInvalidState, // an instance is not a template
			TypeForkTemplate:  ErrorTypeInvalidState,
		} {
			h, err := rawExchange(ctx, p.client, Header{Type: typ, ID: "u-" + typ})
			if err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			if h.Type != TypeError || h.ID != "u-"+typ || h.Error == nil || h.Error.ErrorType != want {
				t.Errorf("%s answered with %+v (error %+v), want error %s", typ, h, h.Error, want)
			}
		}
		if got := invokeOK(t, p, "c1", `{"still": "serving"}`, nil); string(got) != `{"still": "serving"}` {
			t.Errorf("after unknown messages: %s", got)
		}
	}},

	{"checkpoint hand-over", func(t *testing.T, p *agentProc) {
		ready(t, p, "import random\nn = 0\ndef handler(event, context):\n    global n\n    n += 1\n    print('call', n)\n    return {'n': n, 'r': random.random()}\n")
		ctx := testenv.Ctx(t)
		invokeOK(t, p, "c1", `{}`, nil)
		// A bad listen path is refused and the agent keeps serving here.
		if _, err := p.client.PrepareCheckpoint(ctx, "relative.sock", true, nil); err == nil {
			t.Fatal("PrepareCheckpoint with a relative path succeeded")
		}
		for round := 2; round <= 4; round++ {
			sock := filepath.Join(t.TempDir(), "ctl", "ctl.sock")
			ready, err := p.client.PrepareCheckpoint(ctx, sock, round%2 == 0, nil)
			if err != nil {
				t.Fatalf("round %d: PrepareCheckpoint: %v", round, err)
			}
			if ready.RSSBefore <= 0 || ready.RSSAfter <= 0 {
				t.Errorf("round %d: rss %d -> %d", round, ready.RSSBefore, ready.RSSAfter)
			}
			// The old connection is gone: the Client refuses to use it.
			if err := p.client.Ping(ctx, nil); !errors.Is(err, ErrUnusable) {
				t.Fatalf("round %d: Ping on the old connection = %v, want ErrUnusable", round, err)
			}
			conn, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatalf("round %d: dial %s: %v", round, sock, err)
			}
			p.client = NewClient(conn)
			res, err := p.client.AfterRestore(ctx, round == 3)
			if err != nil {
				t.Fatalf("round %d: AfterRestore: %v", round, err)
			}
			if res.Pid <= 0 || res.ClockJump < 0 {
				t.Errorf("round %d: resumed %+v", round, res)
			}
			var l logs
			got := invokeOK(t, p, "c"+strconv.Itoa(round), `{}`, l.add)
			var r struct{ N int }
			if err := json.Unmarshal(got, &r); err != nil || r.N != round {
				t.Fatalf("round %d: result %s, want n=%d (state kept across the hand-over)", round, got, round)
			}
			if out := l.text("c"+strconv.Itoa(round), "stdout"); out != fmt.Sprintf("call %d\n", round) {
				t.Errorf("round %d: stdout %q", round, out)
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("round %d: socket file left behind (%v)", round, err)
			}
		}
	}},

	{"mid-call hand-over", func(t *testing.T, p *agentProc) {
		// The handler holds a socket for its first steps (a hand-over is
		// deferred then), and folds its state into the result.
		ready(t, p, `import socket, time
def handler(event, context):
    s = socket.socket()
    acc = 0
    for i in range(event["steps"]):
        if i == event["close_at"]:
            s.close()
        acc += i
        time.sleep(0.005)
    print("done", acc)
    return {"acc": acc}
`)
		ctx := testenv.Ctx(t)
		sock := filepath.Join(t.TempDir(), "ctl", "ctl.sock")
		type out struct {
			res []byte
			err error
		}
		done := make(chan out, 1)
		go func() {
			res, ferr, err := p.client.Invoke(ctx, InvokeParams{ID: "m1", Payload: []byte(`{"steps": 200, "close_at": 40}`),
				CheckpointListen: sock}, nil)
			if ferr != nil {
				err = fmt.Errorf("function error %+v", ferr)
			}
			done <- out{res, err}
		}()
		var o out
	signal:
		for {
			_ = p.cmd.Process.Signal(CheckpointSignal)
			select {
			case o = <-done:
				break signal
			case <-time.After(5 * time.Millisecond):
			}
		}
		var ck *Checkpointed
		if !errors.As(o.err, &ck) {
			t.Fatalf("Invoke under signals = %s, %v; want a *Checkpointed", o.res, o.err)
		}
		if ck.CallID != "m1" || ck.Defers == 0 || !strings.Contains(ck.Reason, "socket") {
			t.Errorf("checkpointed %+v: want deferrals while the handler held its socket", ck)
		}
		// As after a failed dump: reconnect to the same process.
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		p.client = NewClient(conn)
		res, err := p.client.AfterRestore(ctx, false)
		if err != nil || res.InCall != "m1" {
			t.Fatalf("AfterRestore = %+v, %v; want the call m1 in flight", res, err)
		}
		var l logs
		got, ferr, err := p.client.Await(ctx, "m1", l.add)
		if err != nil || ferr != nil || string(got) != `{"acc": 19900}` {
			t.Fatalf("Await = %s, %+v, %v", got, ferr, err)
		}
		if out := l.text("m1", "stdout"); out != "done 19900\n" {
			t.Errorf("stdout after the hand-over %q", out)
		}
		// A signal between calls does nothing.
		_ = p.cmd.Process.Signal(CheckpointSignal)
		if got := invokeOK(t, p, "m2", `{"steps": 3, "close_at": 0}`, nil); string(got) != `{"acc": 3}` {
			t.Errorf("the next call: %s", got)
		}
	}},

	{"invoke before init", func(t *testing.T, p *agentProc) {
		if _, err := p.client.Handshake(testenv.Ctx(t)); err != nil {
			t.Fatal(err)
		}
		_, ferr, err := p.client.Invoke(testenv.Ctx(t), InvokeParams{ID: "early"}, nil)
		if err != nil || ferr == nil || ferr.ErrorType != ErrorTypeInvalidState {
			t.Fatalf("Invoke before init: err %v, ferr %+v; want %s", err, ferr, ErrorTypeInvalidState)
		}
	}},

	{"ping", func(t *testing.T, p *agentProc) {
		if _, err := p.client.Handshake(testenv.Ctx(t)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := p.client.Ping(testenv.Ctx(t), nil); err != nil {
				t.Fatalf("Ping %d: %v", i, err)
			}
		}
	}},
}
