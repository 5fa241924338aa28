package sandbox

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMountKey(t *testing.T) {
	tests := []struct{ target, prefix string }{
		{"/usr", "usr-"},
		{"/var/task", "var-task-"},
		{"/root/.pyenv/versions/3.11.7", "root--pyenv-versions-3-11-7-"},
		{"/" + strings.Repeat("a", 100), strings.Repeat("a", 40) + "-"},
	}
	for _, tt := range tests {
		k := mountKey(tt.target)
		if !strings.HasPrefix(k, tt.prefix) || len(k) != len(tt.prefix)+8 {
			t.Errorf("mountKey(%q) = %q, want %q + 8 hex digits", tt.target, k, tt.prefix)
		}
	}
	// Targets that differ only in punctuation keep distinct keys.
	if mountKey("/a.b") == mountKey("/a-b") {
		t.Error("mountKey(/a.b) == mountKey(/a-b)")
	}
}

func TestExternalMounts(t *testing.T) {
	m := newTestManager(t)
	spec := Spec{Binds: []Bind{{Source: "/tmp/code", Target: "/var/task"}}}
	ms := m.ExternalMounts(spec)
	targets := map[string]string{}
	for _, m := range ms {
		targets[m.Target] = m.Source
	}
	for _, want := range []string{"/usr", "/dev", "/dev/null", "/dev/urandom", "/var/task"} {
		if _, ok := targets[want]; !ok {
			t.Errorf("ExternalMounts lacks %s: %v", want, ms)
		}
	}
	if targets["/var/task"] != "/tmp/code" {
		t.Errorf("/var/task comes from %q", targets["/var/task"])
	}
}

func TestFindInit(t *testing.T) {
	tests := []struct {
		name   string
		script string // "" = no torpor-init at all
		found  bool
	}{
		{"missing", "", false},
		{"this build", "#!/bin/sh\necho " + InitVersion + "\n", true},
		{"another build", "#!/bin/sh\necho torpor-init/0\n", false},
		{"broken", "#!/bin/sh\nexit 3\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.script != "" {
				if err := os.WriteFile(filepath.Join(dir, "torpor-init"), []byte(tt.script), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			got := FindInit(context.Background(), filepath.Join(dir, "torpor"))
			if (got != "") != tt.found {
				t.Errorf("FindInit = %q, want found=%v", got, tt.found)
			}
		})
	}
}

func TestInetSockets(t *testing.T) {
	before, err := InetSockets(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	after, err := InetSockets(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("InetSockets = %d with a listener, %d without", after, before)
	}
}
