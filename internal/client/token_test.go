package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api-token")
	if err := os.WriteFile(file, []byte("from-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	blank := filepath.Join(dir, "blank")
	if err := os.WriteFile(blank, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, flag, env, file, want string
	}{
		{"flag wins over everything", "from-flag", "from-env", file, "from-flag"},
		{"env when no flag", "", "from-env", file, "from-env"},
		{"file when neither", "", "", file, "from-file-0123456789"},
		{"blank flag and env fall through", "  ", "\t", file, "from-file-0123456789"},
		{"flag and env are trimmed", " from-flag\n", "", file, "from-flag"},
		{"missing file", "", "", filepath.Join(dir, "nope"), ""},
		{"blank file", "", "", blank, ""},
		{"unreadable (a directory)", "", "", dir, ""},
		{"no file named", "", "", "", ""},
		{"env without file", "", "from-env", "", "from-env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ResolveToken(tt.flag, tt.env, tt.file); got != tt.want {
				t.Errorf("ResolveToken(%q, %q, %q) = %q, want %q", tt.flag, tt.env, tt.file, got, tt.want)
			}
		})
	}
}

func TestToken(t *testing.T) {
	const token = "the-token-0123456789"
	var gotAuth []string
	gw := gateway.New(gatewaytest.NewBackend(), gateway.Options{Token: token})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = append(gotAuth, r.Header.Get("Authorization"))
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	ctx := context.Background()

	tests := []struct {
		name      string
		opts      []Option
		sent      string
		ok        bool
		tokenSent bool
	}{
		{"right token", []Option{WithToken(token)}, "Bearer " + token, true, true},
		{"wrong token", []Option{WithToken("wrong-0123456789")}, "Bearer wrong-0123456789", false, true},
		{"no token", nil, "", false, false},
		{"empty token", []Option{WithToken("")}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotAuth = nil
			c, err := New(ts.URL, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Functions(ctx)
			if len(gotAuth) != 1 || gotAuth[0] != tt.sent {
				t.Errorf("Authorization sent %q, want %q", gotAuth, tt.sent)
			}
			if tt.ok {
				if err != nil {
					t.Fatalf("Functions: %v", err)
				}
				return
			}
			var ae *AuthError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v (%T), want *AuthError", err, err)
			}
			if ae.Endpoint != ts.URL || ae.TokenSent != tt.tokenSent {
				t.Errorf("AuthError %+v, want endpoint %s, TokenSent %v", ae, ts.URL, tt.tokenSent)
			}
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != api.CodeUnauthorized {
				t.Errorf("wrapped APIError %+v", apiErr)
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("error %q shows the token", err)
			}
		})
	}
}
