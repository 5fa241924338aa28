package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
	"github.com/torpor-dev/torpor/internal/testenv"
)

const cliToken = "cli-token-0123456789abcdef"

// authEnv is a gateway that requires cliToken, recording the Authorization
// header of every request.
type authEnv struct {
	*cliEnv
	mu    sync.Mutex
	auth  []string // Authorization of each request
	paths []string // and its path
}

func newAuthEnv(t *testing.T) *authEnv {
	t.Helper()
	b := gatewaytest.NewBackend()
	gw := gateway.New(b, gateway.Options{Token: cliToken})
	e := &authEnv{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.auth = append(e.auth, r.Header.Get("Authorization"))
		e.paths = append(e.paths, r.URL.Path)
		e.mu.Unlock()
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.cliEnv = &cliEnv{url: ts.URL, b: b}
	return e
}

// tokenHome makes a TORPOR_HOME holding token (none when empty) and points
// TORPOR_HOME at it.
func tokenHome(t *testing.T, token string) string {
	t.Helper()
	home := t.TempDir()
	if token != "" {
		if err := os.WriteFile(filepath.Join(home, "api-token"), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TORPOR_HOME", home)
	return home
}

func TestTokenResolution(t *testing.T) {
	const hint = "set TORPOR_TOKEN or --token (the server's token is in $TORPOR_HOME/api-token)"
	tests := []struct {
		name      string
		flag      string // --token; "" = not given
		env       string // TORPOR_TOKEN; "" = unset
		file      string // $TORPOR_HOME/api-token; "" = absent
		code      int
		stderr    string // exact
		wantNoHdr bool
	}{
		{name: "flag beats env and file", flag: cliToken, env: "wrong-env-0123456789", file: "wrong-file-0123456789"},
		{name: "env beats file", env: cliToken, file: "wrong-file-0123456789"},
		{name: "file when nothing is set", file: cliToken},
		{name: "wrong flag", flag: "wrong-flag-0123456789", file: cliToken, code: exitError,
			stderr: "torpor: torpor at {url} refused the API token: " + hint + "\n"},
		{name: "wrong env", env: "wrong-env-0123456789", code: exitError,
			stderr: "torpor: torpor at {url} refused the API token: " + hint + "\n"},
		{name: "no token anywhere", code: exitError, wantNoHdr: true,
			stderr: "torpor: torpor at {url} wants an API token and none was found (--token, TORPOR_TOKEN, {home}/api-token): " + hint + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newAuthEnv(t)
			home := tokenHome(t, tc.file)
			t.Setenv("TORPOR_TOKEN", tc.env)
			if tc.env == "" {
				os.Unsetenv("TORPOR_TOKEN")
			}
			args := []string{"ls"}
			if tc.flag != "" {
				args = append(args, "--token", tc.flag)
			}
			r := e.run(t, "", args...)
			if tc.code == 0 {
				r.want(t, 0, "", "no functions")
			} else {
				want := strings.NewReplacer("{url}", e.url, "{home}", home).Replace(tc.stderr)
				if r.code != tc.code || r.stderr != want {
					t.Errorf("exit %d, stderr\n%q\nwant exit %d,\n%q", r.code, r.stderr, tc.code, want)
				}
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			wantHdr := "Bearer " + cliToken
			switch {
			case tc.wantNoHdr:
				wantHdr = ""
			case tc.flag != "":
				wantHdr = "Bearer " + tc.flag
			case tc.env != "":
				wantHdr = "Bearer " + tc.env
			}
			if len(e.auth) != 1 || e.auth[0] != wantHdr {
				t.Errorf("Authorization sent %q, want %q", e.auth, wantHdr)
			}
			for _, s := range []string{r.stdout, r.stderr} {
				if strings.Contains(s, cliToken) || strings.Contains(s, "wrong-") {
					t.Errorf("output shows a token: %q", s)
				}
			}
		})
	}
}

// Without TORPOR_HOME the file is ~/.torpor/api-token, where `torpor up`
// with default flags writes it.
func TestTokenFileInUserHome(t *testing.T) {
	e := newAuthEnv(t)
	os.Unsetenv("TORPOR_TOKEN")
	t.Setenv("TORPOR_HOME", "")
	os.Unsetenv("TORPOR_HOME")
	home := t.TempDir()
	t.Setenv("HOME", home)
	if err := os.MkdirAll(filepath.Join(home, ".torpor"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".torpor", "api-token"), []byte(cliToken), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run(t, "", "ls").want(t, 0, "", "no functions")
}

// The token never becomes a flag default, which --help would print.
func TestTokenNotInHelp(t *testing.T) {
	t.Setenv("TORPOR_TOKEN", cliToken)
	var out, errOut bytes.Buffer
	code := run(context.Background(), newRootCmd(), []string{"ls", "--help"}, strings.NewReader(""), &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "--token") {
		t.Fatalf("exit %d, help %q", code, out.String())
	}
	if strings.Contains(out.String()+errOut.String(), cliToken) {
		t.Errorf("help shows TORPOR_TOKEN:\n%s", out.String())
	}
}

// bench warm resolves the token like every client command: the deploy
// reaches the backend.
func TestBenchWarmSendsToken(t *testing.T) {
	py := testenv.Python(t) // for the baseline server
	e := newAuthEnv(t)
	tokenHome(t, cliToken)
	os.Unsetenv("TORPOR_TOKEN")
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	// The fake backend's handler echoes, so the measured calls "fail" the
	// NOP check; what matters here is that no request was refused.
	run(ctx, newRootCmd(), []string{"--endpoint", e.url, "bench", "warm", "--calls", "2", "--warmup", "0",
		"--concurrency", "1", "--out", out, "--python", py}, strings.NewReader(""), &stdout, &stderr)
	if len(e.b.Fns["bench-nop"]) != 1 {
		t.Fatalf("bench-nop was not deployed:\n%s%s", stdout.String(), stderr.String())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for i, a := range e.auth {
		if e.paths[i] == "/healthz" {
			continue // open: the start-up check sends no token
		}
		if a != "Bearer "+cliToken {
			t.Errorf("bench sent %s with Authorization %q", e.paths[i], a)
		}
		n++
	}
	if n < 1+2+2 { // the deploy, REST and Lambda calls
		t.Errorf("only %d requests reached the gateway: %q", n, e.paths)
	}
	if strings.Contains(stdout.String()+stderr.String(), "HTTP 401") || strings.Contains(stdout.String()+stderr.String(), "HTTP 403") {
		t.Errorf("refused requests:\n%s%s", stdout.String(), stderr.String())
	}
}
