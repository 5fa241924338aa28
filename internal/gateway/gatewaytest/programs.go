package gatewaytest

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/torpor-dev/torpor/internal/function"
)

// Python modules the fake understands. Deployed as the handler's module
// (app.py for app.handler), each makes the fake do what the Python agent
// does with that source, so that the conformance suite can hold the fake
// and the real backend to the same behaviour. The fake does not run Python:
// it recognises these exact texts; any other code gets the canned handler
// described on Backend.
const (
	// EchoSource prints LogMarker and returns the event.
	EchoSource = "def handler(event, context):\n    print(\"" + LogMarker + "\")\n    return event\n"
	// RaiseSource fails every call with ValueError("boom").
	RaiseSource = "def handler(event, context):\n    raise ValueError(\"boom\")\n"
	// SyntaxErrorSource cannot be imported: its def lacks the colon.
	SyntaxErrorSource = "def handler(event, context)\n    return event\n"
	// LogMarker is the line EchoSource prints on every call.
	LogMarker = "log-marker"
)

// program is what the fake does for one recognised module: what the module
// defines, whether importing it fails, and what calling its handler does.
type program struct {
	defines     string // the one function the module defines
	syntaxError bool
	// run returns the result (or the error) and the lines printed to stdout.
	run func(event []byte) ([]byte, *function.Error, []string)
}

var programs = map[string]program{
	EchoSource: {defines: "handler", run: func(event []byte) ([]byte, *function.Error, []string) {
		out := bytes.TrimSpace(event)
		if len(out) == 0 {
			out = []byte("null")
		}
		return out, nil, []string{LogMarker}
	}},
	RaiseSource: {defines: "handler", run: func([]byte) ([]byte, *function.Error, []string) {
		return nil, &function.Error{ErrorType: "ValueError", ErrorMessage: "boom",
			StackTrace: []string{"  File \"/var/task/app.py\", line 2, in handler\n    raise ValueError(\"boom\")\n"}}, nil
	}},
	SyntaxErrorSource: {syntaxError: true},
}

// loadProgram finds the program a deploy's handler names, or nil when the
// code is not a zip holding one of the recognised modules (the fake then
// accepts it, as it always did). An import the agent would reject is an
// init error shaped as the agent reports it.
func loadProgram(handler string, code []byte) (*program, *function.Error) {
	zr, err := zip.NewReader(bytes.NewReader(code), int64(len(code)))
	if err != nil {
		return nil, nil
	}
	i := strings.LastIndexByte(handler, '.')
	if i < 0 {
		return nil, nil
	}
	modname, fname := handler[:i], handler[i+1:]
	f, err := zr.Open(strings.ReplaceAll(modname, ".", "/") + ".py")
	if err != nil {
		return nil, nil
	}
	src, err := io.ReadAll(io.LimitReader(f, 1<<20))
	f.Close()
	if err != nil {
		return nil, nil
	}
	p, ok := programs[string(src)]
	switch {
	case !ok:
		return nil, nil
	case p.syntaxError:
		file := strings.ReplaceAll(modname, ".", "/") + ".py"
		return nil, &function.Error{ErrorType: "Runtime.UserCodeSyntaxError",
			ErrorMessage: fmt.Sprintf("Syntax error in module '%s': expected ':' (%s, line 1)", modname, file),
			StackTrace:   []string{fmt.Sprintf("  File \"/var/task/%s\", line 1\n", file), "    def handler(event, context)\n"}}
	case fname != p.defines:
		return nil, &function.Error{ErrorType: "Runtime.HandlerNotFound",
			ErrorMessage: fmt.Sprintf("Handler '%s' missing on module '%s'", fname, modname)}
	}
	return &p, nil
}
