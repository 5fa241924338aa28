package e2e

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestBadInput: every kind of bad input gets a clear error and the platform
// keeps serving.
func TestBadInput(t *testing.T) {
	s := startServer(t)
	s.deploy("ok", "def handler(e, c):\n    return 'fine'\n", deployOpts{})
	healthy := func(t *testing.T) {
		t.Helper()
		if got := mustOK(t, s.invoke("ok", `{}`)); got != `"fine"` {
			t.Fatalf("platform stopped serving: %s", got)
		}
	}

	t.Run("unknown function", func(t *testing.T) {
		r := s.invoke("missing", `{}`)
		if r.Status != 404 || !strings.Contains(r.Body, "missing") {
			t.Errorf("REST: %d %s", r.Status, r.Body)
		}
		r = s.post("/2015-03-31/functions/missing/invocations", `{}`, nil)
		if r.Status != 404 || r.Header.Get("X-Amzn-ErrorType") != "ResourceNotFoundException" {
			t.Errorf("Lambda: %d %v %s", r.Status, r.Header, r.Body)
		}
	})
	t.Run("malformed JSON", func(t *testing.T) {
		r := s.invoke("ok", `{"a":`)
		if r.Status != 400 || !strings.Contains(strings.ToLower(r.Body), "json") {
			t.Errorf("%d %s", r.Status, r.Body)
		}
	})
	t.Run("payload over 6 MB", func(t *testing.T) {
		big := `"` + strings.Repeat("x", 6<<20+10) + `"`
		if r := s.invoke("ok", big); r.Status != 413 {
			t.Errorf("%d %s", r.Status, tail(r.Body, 200))
		}
		// Just under the limit works.
		near := `"` + strings.Repeat("y", 6<<20-100) + `"`
		s.deploy("len", "def handler(e, c):\n    return len(e)\n", deployOpts{MemoryMB: 256})
		if got := mustOK(t, s.invoke("len", near)); got != fmt.Sprint(6<<20-100) {
			t.Errorf("near-limit payload: %s", got)
		}
	})
	t.Run("response over 6 MB", func(t *testing.T) {
		s.deploy("bigout", "def handler(e, c):\n    return 'z' * e\n", deployOpts{MemoryMB: 256})
		typ, msg, _ := funcError(t, s.invoke("bigout", fmt.Sprint(7<<20)))
		if typ != "Function.ResponseSizeTooLarge" || !strings.Contains(msg, "exceeded maximum allowed payload size") {
			t.Errorf("%s: %s", typ, msg)
		}
		if got := mustOK(t, s.invoke("bigout", `3`)); got != `"zzz"` {
			t.Errorf("after a too-large response: %s", got)
		}
	})
	t.Run("log flood", func(t *testing.T) {
		// 300k empty lines: tiny as text, ~40 MB as JSON log lines.
		s.deploy("flood", "import os\ndef handler(e, c):\n    os.write(1, b'\\n' * 300000)\n    print('flood-done')\n    return 1\n", deployOpts{})
		mustOK(t, s.invoke("flood", `{}`))
		eventually(t, 10*time.Second, "the flood's log", func() error {
			out, _, err := s.cli("logs", "flood")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "REPORT RequestId") {
				return fmt.Errorf("no REPORT line in %d bytes of logs", len(out))
			}
			return nil
		})
	})
	t.Run("invalid name", func(t *testing.T) {
		for _, name := range []string{"bad.name", strings.Repeat("a", 65), "sp%20ace"} {
			code, body := s.deployZip(name, zipFiles(t, map[string]string{"app.py": "def handler(e,c): pass"}), deployOpts{})
			if code != 400 && code != 404 {
				t.Errorf("deploy %q: %d %s", name, code, body)
			}
		}
		code, body := s.deployZip("bad.name", zipFiles(t, map[string]string{"app.py": "def handler(e,c): pass"}), deployOpts{})
		if code != 400 || !strings.Contains(body, "A-Za-z0-9_-") {
			t.Errorf("deploy bad.name: %d %s", code, body)
		}
	})
	t.Run("missing handler", func(t *testing.T) {
		code, body := s.deployZip("nohandler", zipFiles(t, map[string]string{"app.py": "def other(e, c): pass\n"}), deployOpts{})
		if code != 400 || !strings.Contains(body, "HandlerNotFound") {
			t.Errorf("%d %s", code, body)
		}
		code, body = s.deployZip("nomodule", zipFiles(t, map[string]string{"main.py": "x=1\n"}), deployOpts{})
		if code != 400 || !strings.Contains(body, "ImportModuleError") {
			t.Errorf("%d %s", code, body)
		}
	})
	t.Run("syntax error", func(t *testing.T) {
		code, body := s.deployZip("syntax", zipFiles(t, map[string]string{"app.py": "def handler(e, c):\n    return (\n"}), deployOpts{})
		if code != 400 || !strings.Contains(body, "SyntaxError") && !strings.Contains(body, "Syntax error") || !strings.Contains(body, "app.py") {
			t.Errorf("%d %s", code, body)
		}
		if r := s.invoke("syntax", `{}`); r.Status != 404 {
			t.Errorf("rejected function was stored: %d", r.Status)
		}
	})
	t.Run("handler raises", func(t *testing.T) {
		s.deploy("raiser", "def handler(e, c):\n    raise KeyError('nope')\n", deployOpts{})
		typ, msg, stack := funcError(t, s.invoke("raiser", `{}`))
		if typ != "KeyError" || !strings.Contains(msg, "nope") || len(stack) == 0 || !strings.Contains(strings.Join(stack, ""), "app.py") {
			t.Errorf("%s %s %v", typ, msg, stack)
		}
		r := s.post("/2015-03-31/functions/raiser/invocations", `{}`, nil)
		if r.Status != 200 || r.Header.Get("X-Amz-Function-Error") != "Unhandled" {
			t.Errorf("Lambda route: %d %v", r.Status, r.Header)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		s.deploy("slow", "import time\ndef handler(e, c):\n    time.sleep(e)\n    return 'done'\n", deployOpts{TimeoutS: 1})
		start := time.Now()
		_, msg, _ := funcError(t, s.invoke("slow", `30`))
		if !strings.Contains(msg, "Task timed out after 1.00 seconds") {
			t.Errorf("message %q", msg)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("timed-out call took %s", el)
		}
		if got := mustOK(t, s.invoke("slow", `0`)); got != `"done"` {
			t.Errorf("after timeout: %s", got)
		}
	})
	t.Run("memory limit", func(t *testing.T) {
		s.deploy("hog", "def handler(e, c):\n    if e: return 'small'\n    b = bytearray(400 * 1024 * 1024)\n    return len(b)\n", deployOpts{MemoryMB: 128})
		typ, msg, _ := funcError(t, s.invoke("hog", `0`))
		if !strings.Contains(msg, "128 MB") {
			t.Errorf("%s: %q does not name the limit", typ, msg)
		}
		if got := mustOK(t, s.invoke("hog", `1`)); got != `"small"` {
			t.Errorf("after OOM: %s", got)
		}
		healthy(t)
	})
	t.Run("process exits", func(t *testing.T) {
		s.deploy("exiter", "import os, ctypes\ndef handler(e, c):\n    if e == 'exit': os._exit(3)\n    if e == 'segv': ctypes.string_at(0)\n    return 'alive'\n", deployOpts{})
		for _, how := range []string{"exit", "segv"} {
			typ, msg, _ := funcError(t, s.invoke("exiter", `"`+how+`"`))
			if !strings.Contains(msg, "Runtime exited") {
				t.Errorf("%s: %s %q", how, typ, msg)
			}
			if got := mustOK(t, s.invoke("exiter", `"x"`)); got != `"alive"` {
				t.Errorf("after %s: %s", how, got)
			}
		}
	})
	t.Run("zip slip and symlinks", func(t *testing.T) {
		for name, zb := range map[string][]byte{
			"dotdot":  rawZip(t, "../evil.py", "x=1", 0),
			"abs":     rawZip(t, "/etc/evil.py", "x=1", 0),
			"symlink": rawZip(t, "link", "/etc/passwd", 0o777|modeSymlink),
			"escape":  rawZip(t, "link", "../../../etc/passwd", 0o777|modeSymlink),
		} {
			code, body := s.deployZip("zip"+name, zb, deployOpts{})
			if code != 400 {
				t.Errorf("%s: %d %s", name, code, body)
			}
		}
		healthy(t)
	})
	t.Run("bad spec", func(t *testing.T) {
		src := zipFiles(t, map[string]string{"app.py": "def handler(e,c): pass"})
		for _, o := range []deployOpts{{MemoryMB: 1}, {TimeoutS: -1}, {Runtime: "cobol"}, {Handler: "nodot"}} {
			if code, body := s.deployZip("spec", src, o); code != 400 {
				t.Errorf("%+v: %d %s", o, code, body)
			}
		}
	})
	t.Run("not json body on deploy", func(t *testing.T) {
		r := s.post("/v1/functions/x/invoke", "not json", nil)
		var e map[string]any
		if r.Status != 400 || json.Unmarshal([]byte(r.Body), &e) != nil {
			t.Errorf("%d %s", r.Status, r.Body)
		}
	})
}

const modeSymlink = 0o120000

// rawZip builds a zip with one entry whose name and unix mode are chosen by
// the test, as an attacker would.
func rawZip(t *testing.T, name, body string, unixMode uint32) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	h := &zip.FileHeader{Name: name, Method: zip.Store, CreatorVersion: 3 << 8}
	if unixMode != 0 {
		h.ExternalAttrs = unixMode << 16
	}
	w, err := zw.CreateHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte(body))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
