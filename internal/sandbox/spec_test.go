package sandbox

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestSpecNormalize(t *testing.T) {
	valid := func() Spec {
		return Spec{ID: "fn-1", UID: 1000, GID: 1000, Argv: []string{"/bin/true"}}
	}
	tests := []struct {
		name    string
		edit    func(*Spec)
		errText string // "" means valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"uid 0", func(s *Spec) { s.UID = 0 }, "non-root"},
		{"gid 0", func(s *Spec) { s.GID = 0 }, "non-root"},
		{"negative uid", func(s *Spec) { s.UID = -1 }, "non-root"},
		{"empty id", func(s *Spec) { s.ID = "" }, "id must be"},
		{"id with slash", func(s *Spec) { s.ID = "../x" }, "id must be"},
		{"upper-case id", func(s *Spec) { s.ID = "Fn" }, "id must be"},
		{"id too long", func(s *Spec) { s.ID = strings.Repeat("a", 65) }, "id must be"},
		{"id starting with a dash", func(s *Spec) { s.ID = "-a" }, "id must be"},
		{"longest id", func(s *Spec) { s.ID = strings.Repeat("a", 64) }, ""},
		{"no argv", func(s *Spec) { s.Argv = nil }, "argv[0]"},
		{"relative argv0", func(s *Spec) { s.Argv = []string{"python3"} }, "argv[0]"},
		{"relative dir", func(s *Spec) { s.Dir = "task" }, "dir"},
		{"hostname with slash", func(s *Spec) { s.Hostname = "a/b" }, "hostname"},
		{"relative bind source", func(s *Spec) { s.Binds = []Bind{{Source: "code", Target: "/var/task"}} }, "bind source"},
		{"unclean bind target", func(s *Spec) { s.Binds = []Bind{{Source: "/c", Target: "/var/../task"}} }, "clean"},
		{"bind over /proc", func(s *Spec) { s.Binds = []Bind{{Source: "/c", Target: "/proc/x"}} }, "/proc"},
		{"bind over /", func(s *Spec) { s.Binds = []Bind{{Source: "/c", Target: "/"}} }, "hide"},
		{"bind over /tmp", func(s *Spec) { s.Binds = []Bind{{Source: "/c", Target: "/tmp"}} }, "/tmp"},
		{"nil extra file", func(s *Spec) { s.ExtraFiles = []*os.File{os.Stdin, nil} }, "fd 4"},
		{"negative limit", func(s *Spec) { s.Limits.Pids = -1 }, "negative"},
		{"memory below minimum", func(s *Spec) { s.Limits.MemoryMB = 4 }, "minimum"},
		{"pids below minimum", func(s *Spec) { s.Limits.Pids = 2 }, "minimum"},
		{"cpu shares too high", func(s *Spec) { s.Limits.CPUShares = 1 << 20 }, "cpu shares"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := valid()
			tt.edit(&s)
			err := s.normalize()
			if tt.errText == "" {
				if err != nil {
					t.Fatal(err)
				}
				if s.Dir != "/" || s.Hostname != "torpor" || s.Limits.TmpMB != DefaultTmpMB || s.Limits.NoFile != DefaultNoFile {
					t.Errorf("defaults not applied: %+v", s)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("error %v, want ErrInvalid containing %q", err, tt.errText)
			}
		})
	}
}

func TestInitErrorClass(t *testing.T) {
	tests := []struct {
		status string
		step   string
		class  error
	}{
		{`{"step":"exec","error":"/x: no such file or directory"}`, "exec", errdefs.ErrInvalid},
		{`{"step":"chdir","error":"/x: no such file or directory"}`, "chdir", errdefs.ErrInvalid},
		{`{"step":"bind /var/task","error":"source /c: no such file or directory"}`, "bind /var/task", errdefs.ErrInvalid},
		{`{"step":"mount /proc","error":"operation not permitted"}`, "mount /proc", errdefs.ErrUnavailable},
		{`not json`, "init", errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		e := newInitError([]byte(tt.status))
		if e.Step != tt.step || !errors.Is(e, tt.class) || !strings.HasPrefix(e.Error(), "torpor sandbox init: "+tt.step+": ") {
			t.Errorf("%s: got %#v (%v), want step %q class %v", tt.status, e, e, tt.step, tt.class)
		}
	}
}
