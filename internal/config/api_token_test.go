package config

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestAPITokenPath(t *testing.T) {
	tests := []struct {
		name string
		c    Config
		want string
	}{
		{"follows home", Config{Home: "/srv/torpor"}, "/srv/torpor/api-token"},
		{"explicit file", Config{Home: "/srv/torpor", APITokenFile: "/etc/torpor/token"}, "/etc/torpor/token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.APITokenPath(); got != tt.want {
				t.Errorf("APITokenPath() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadAPITokenCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api-token")
	tok, err := LoadAPIToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if !tok.Created || tok.Path != path {
		t.Errorf("got %+v, want Created and Path %s", tok, path)
	}
	raw, err := hex.DecodeString(tok.Value)
	if err != nil || len(raw) != 32 {
		t.Errorf("token %q is not 32 hex-encoded bytes (%v)", tok.Value, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 || tok.Mode != 0o600 {
		t.Errorf("mode %o (reported %o), want 0600", perm, tok.Mode)
	}
	if b, _ := os.ReadFile(path); string(b) != tok.Value {
		t.Errorf("file holds %q, want exactly the token %q", b, tok.Value)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}

	// The second start reads the same token.
	again, err := LoadAPIToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || again.Value != tok.Value {
		t.Errorf("second load %+v, want the same token, not created", again)
	}
}

// Two servers starting at once on one home end up with one token.
func TestLoadAPITokenConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api-token")
	const n = 8
	toks := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := LoadAPIToken(path)
			toks[i], errs[i] = tok.Value, err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("load %d: %v", i, errs[i])
		}
		if toks[i] != toks[0] {
			t.Errorf("load %d got %q, load 0 got %q", i, toks[i], toks[0])
		}
	}
}

func TestLoadAPITokenGiven(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string   // the token, when accepted
		errs    []string // parts of the error, when rejected
	}{
		{name: "trailing newline", content: "0123456789abcdef0123\n", mode: 0o600, want: "0123456789abcdef0123"},
		{name: "surrounding space", content: "  tok-en_with.all~chars+and=  \r\n", mode: 0o600, want: "tok-en_with.all~chars+and="},
		{name: "lax mode is reported", content: "0123456789abcdef0123", mode: 0o644, want: "0123456789abcdef0123"},
		{name: "empty", content: "", mode: 0o600, errs: []string{"0 characters", "16"}},
		{name: "blank", content: " \n", mode: 0o600, errs: []string{"0 characters"}},
		{name: "too short", content: "short", mode: 0o600, errs: []string{"5 characters", "16 to 512"}},
		{name: "too long", content: strings.Repeat("a", 513), mode: 0o600, errs: []string{"513 characters"}},
		{name: "slash breaks SigV4", content: "0123456789abcdef/0123", mode: 0o600, errs: []string{`'/'`, "A-Z a-z 0-9"}},
		{name: "inner space", content: "0123456789 abcdef0123", mode: 0o600, errs: []string{`' '`}},
		{name: "comma", content: "0123456789,abcdef0123", mode: 0o600, errs: []string{`','`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
				t.Fatal(err)
			}
			tok, err := LoadAPIToken(path)
			if tt.errs != nil {
				if err == nil {
					t.Fatalf("LoadAPIToken accepted %q as %q", tt.content, tok.Value)
				}
				for _, w := range append(tt.errs, path, "delete the file") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tok.Value != tt.want || tok.Created || tok.Mode != tt.mode {
				t.Errorf("got %+v, want value %q, mode %o, not created", tok, tt.want, tt.mode)
			}
			if b, _ := os.ReadFile(path); string(b) != tt.content {
				t.Errorf("LoadAPIToken rewrote a given token file: %q", b)
			}
		})
	}
}

func TestLoadAPITokenErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		path string
		want []string
	}{
		{"missing directory", filepath.Join(dir, "nope", "api-token"), []string{"create API token", "--api-token-file"}},
		{"a directory", dir, []string{"read API token", dir}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadAPIToken(tt.path)
			if err == nil {
				t.Fatal("LoadAPIToken = nil error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
