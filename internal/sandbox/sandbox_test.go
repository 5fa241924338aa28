package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// TestIsolation runs small programs inside sandboxes and checks what they see.
func TestIsolation(t *testing.T) {
	m := newTestManager(t)

	taskDir := t.TempDir() // world-writable, so only the read-only mount stops writes
	if err := os.Chmod(taskDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(taskDir, "handler.py"), []byte("code\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := t.TempDir()
	if err := os.Chmod(prefix, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prefix, "VERSION"), []byte("3.11.7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(t.TempDir(), "agent.py")
	if err := os.WriteFile(agent, []byte("agent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	if err := os.Chmod(dataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	binds := []Bind{
		{Source: taskDir, Target: "/var/task"},
		{Source: agent, Target: "/opt/torpor/agent.py"},
		{Source: prefix, Target: "/root/.pyenv/versions/3.11.7"},
		{Source: dataDir, Target: "/data", Writable: true},
	}

	tests := []struct {
		name   string
		spec   func(*Spec)
		script string
		check  func(t *testing.T, s Spec, out string)
	}{
		{
			name: "identity without capabilities",
			script: `id -u; id -g; id -G
grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status`,
			check: func(t *testing.T, s Spec, out string) {
				want := fmt.Sprintf("%d\n%d\n%d\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n", s.UID, s.GID, s.GID)
				if out != want {
					t.Errorf("got\n%s\nwant\n%s", out, want)
				}
			},
		},
		{
			// Its own network namespace: only an up loopback, so host
			// services bound to 127.0.0.1 are out of reach.
			name:   "own network namespace",
			script: `awk 'NR>2 {sub(":","",$1); print $1}' /proc/net/dev`,
			check:  wantOut("lo\n"),
		},
		{
			name:   "host network when asked",
			spec:   func(s *Spec) { s.HostNetwork = true },
			script: `awk 'NR>2 {sub(":","",$1); print $1}' /proc/net/dev | sort | tr '\n' ' '`,
			check: func(t *testing.T, _ Spec, out string) {
				if out == "lo " {
					t.Errorf("HostNetwork: sandbox sees only %q", out)
				}
			},
		},
		{
			name:   "pid 1",
			script: `echo $$; cat /proc/1/cmdline | tr '\0' ' '`,
			check: func(t *testing.T, s Spec, out string) {
				if !strings.HasPrefix(out, "1\n/bin/sh -c ") {
					t.Errorf("want the shell as pid 1, got %q", out)
				}
			},
		},
		{
			name:   "host processes invisible",
			script: fmt.Sprintf(`ls /proc | grep -E '^[0-9]+$'; test -e /proc/%d && echo host-visible; true`, os.Getpid()),
			check: func(t *testing.T, s Spec, out string) {
				pids := strings.Fields(out)
				if len(pids) == 0 || len(pids) > 4 || slices.Contains(pids, "host-visible") {
					t.Errorf("want only the sandbox's few processes in /proc, got %q", pids)
				}
				for _, p := range pids {
					if n, _ := strconv.Atoi(p); n > 10 {
						t.Errorf("pid %s is not from a fresh pid namespace", p)
					}
				}
			},
		},
		{
			name:   "hostname",
			spec:   func(s *Spec) { s.Hostname = "fn-hello" },
			script: `cat /proc/sys/kernel/hostname`,
			check:  wantOut("fn-hello\n"),
		},
		{
			name: "writable and read-only paths",
			spec: func(s *Spec) { s.Binds = binds },
			script: `for p in /tmp/f /f /var/task/f /usr/f /etc/f /data/f /dev/f /opt/torpor/f; do
  if echo x 2>/dev/null >$p; then echo "$p writable"; else echo "$p read-only"; fi
done`,
			check: wantOut("/tmp/f writable\n/f read-only\n/var/task/f read-only\n/usr/f read-only\n/etc/f read-only\n/data/f writable\n/dev/f read-only\n/opt/torpor/f read-only\n"),
		},
		{
			name:   "mount flags",
			spec:   func(s *Spec) { s.Binds = binds },
			script: `cat /proc/self/mountinfo`,
			check: func(t *testing.T, s Spec, out string) {
				mounts, err := parseMountinfo(strings.NewReader(out))
				if err != nil {
					t.Fatal(err)
				}
				flags := map[string]string{}
				sc := bufio.NewScanner(strings.NewReader(out))
				for sc.Scan() {
					f := strings.Fields(sc.Text())
					flags[unescapeMount(f[4])] = f[5]
				}
				for _, mp := range []string{"/", "/usr", "/etc", "/var/task", "/opt/torpor/agent.py", "/root/.pyenv/versions/3.11.7", "/dev"} {
					if !strings.HasPrefix(flags[mp], "ro,") {
						t.Errorf("%s: mount flags %q, want read-only", mp, flags[mp])
					}
				}
				for _, mp := range []string{"/tmp", "/data"} {
					if !strings.HasPrefix(flags[mp], "rw,") {
						t.Errorf("%s: mount flags %q, want read-write", mp, flags[mp])
					}
				}
				var tmpOK bool
				for _, mi := range mounts {
					if mi.MountPoint == "/tmp" && mi.FSType == "tmpfs" && slices.Contains(mi.SuperOpts, "size=8192k") {
						tmpOK = true
					}
					if strings.Contains(mi.MountPoint, "oldroot") || strings.HasPrefix(mi.MountPoint, "/sys") {
						t.Errorf("unexpected mount %s", mi.MountPoint)
					}
				}
				if !tmpOK {
					t.Errorf("no 8 MB tmpfs on /tmp in\n%s", out)
				}
			},
		},
		{
			name: "binds visible",
			spec: func(s *Spec) { s.Binds = binds; s.Dir = "/var/task" },
			script: `pwd; cat handler.py /opt/torpor/agent.py /root/.pyenv/versions/3.11.7/VERSION
stat -c '%n %a' /root /root/.pyenv /var /opt`,
			check: wantOut("/var/task\ncode\nagent\n3.11.7\n/root 755\n/root/.pyenv 755\n/var 755\n/opt 755\n"),
		},
		{
			name:   "system directories and devices",
			script: `ls -d /usr/bin /etc/passwd /bin/sh /lib /dev/null /dev/fd/0 /dev/stdout; head -c 4 /dev/zero | wc -c; echo x > /dev/null && echo null-ok; echo shm > /dev/shm/f && cat /dev/shm/f`,
			check:  wantOut("/bin/sh\n/dev/fd/0\n/dev/null\n/dev/stdout\n/etc/passwd\n/lib\n/usr/bin\n4\nnull-ok\nshm\n"),
		},
		{
			name: "environment and rlimits",
			spec: func(s *Spec) {
				s.Env = append(s.Env, "FOO=bar")
				s.Limits.NoFile = 77
				s.Limits.NProc = 500
			},
			script: `echo "$FOO"; ulimit -n; ulimit -c; ulimit -p; umask`,
			check:  wantOut("bar\n77\n0\n500\n0022\n"),
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := shSpec(fmt.Sprintf("iso-%d", i), tt.script)
			if tt.spec != nil {
				tt.spec(&spec)
			}
			o := runSandbox(t, m, spec)
			if o.status != (ExitStatus{}) {
				t.Errorf("exit status %+v, stderr:\n%s", o.status, o.stderr)
			}
			tt.check(t, spec, o.stdout)
		})
	}
}

func wantOut(want string) func(*testing.T, Spec, string) {
	return func(t *testing.T, _ Spec, out string) {
		t.Helper()
		if out != want {
			t.Errorf("got\n%s\nwant\n%s", out, want)
		}
	}
}

// TestExtraFiles checks that ExtraFiles arrive as fd 3, 4, ... and that no
// other descriptor leaks into the program.
func TestExtraFiles(t *testing.T) {
	m := newTestManager(t)
	r3, w3 := pipe(t)
	r4, w4 := pipe(t)
	leak, err := os.Open("/etc/hostname") // close-on-exec like all Go files, but be sure
	if err != nil {
		t.Fatal(err)
	}
	defer leak.Close()
	spec := shSpec("extra", `echo three >&3; echo four >&4; exec 3>&- 4>&-; ls -l /proc/self/fd`)
	spec.ExtraFiles = []*os.File{w3, w4}
	o := runSandbox(t, m, spec)
	w3.Close()
	w4.Close()
	if o.status.Code != 0 {
		t.Fatalf("exit %+v: %s", o.status, o.stderr)
	}
	for _, c := range []struct {
		r    io.Reader
		want string
	}{{r3, "three\n"}, {r4, "four\n"}} {
		b, _ := io.ReadAll(c.r)
		if string(b) != c.want {
			t.Errorf("read %q from the extra file, want %q", b, c.want)
		}
	}
	var fds []string
	for line := range strings.Lines(o.stdout) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[len(f)-2] == "->" && !strings.HasSuffix(f[len(f)-1], "/fd") {
			fds = append(fds, f[len(f)-3])
		}
	}
	if !slices.Equal(fds, []string{"0", "1", "2"}) {
		t.Errorf("open fds after closing 3 and 4: %q, want 0 1 2; ls said:\n%s", fds, o.stdout)
	}
}

// TestOOMKilled checks that a memory hog is killed at its limit and reported.
func TestOOMKilled(t *testing.T) {
	m := newTestManager(t)
	uid := testUID()
	spec := Spec{
		ID: "oom", UID: uid, GID: uid,
		Argv:   []string{"/usr/bin/python3", "-c", "s = 'x' * (256 << 20); print('survived')"},
		Limits: Limits{MemoryMB: 32, Pids: 16},
	}
	o := runSandbox(t, m, spec)
	if !o.status.OOMKilled || o.status.Signal != syscall.SIGKILL || o.status.Code != -1 {
		t.Errorf("exit status %+v, want OOM-killed by SIGKILL; stdout %q stderr %q", o.status, o.stdout, o.stderr)
	}
}

// TestCgroupLimits checks the limits written to the instance cgroup and
// the memory counters read back by Stats.
func TestCgroupLimits(t *testing.T) {
	m := newTestManager(t)
	uid := testUID()
	spec := Spec{
		ID: "limits", UID: uid, GID: uid,
		Argv:   []string{"/usr/bin/python3", "-c", "import time; b = b'x' * (24 << 20); time.sleep(1000)"},
		Limits: Limits{MemoryMB: 100, CPUShares: 512, Pids: 20},
	}
	s, _, _ := startCaptured(t, m, spec)
	// Wait for the allocation: Stats of a live sandbox.
	var st Stats
	testenv.Eventually(t, 10*time.Second, "memory usage of 24 MB", func() bool {
		var err error
		st, err = s.Stats()
		return err == nil && st.MemoryBytes >= 24<<20
	})
	if st.MaxMemoryBytes < st.MemoryBytes {
		t.Errorf("stats %+v: peak below current", st)
	}
	var want map[string]string
	if m.CgroupVersion() == 1 {
		want = map[string]string{"memory.limit_in_bytes": "104857600", "cpu.shares": "512", "pids.max": "20"}
		if m.cg.optional["memsw"] {
			want["memory.memsw.limit_in_bytes"] = "104857600"
		}
	} else {
		want = map[string]string{"memory.max": "104857600", "cpu.weight": strconv.Itoa(sharesToWeight(512)), "pids.max": "20"}
	}
	for file, v := range want {
		ctl, _, _ := strings.Cut(file, ".")
		b, err := os.ReadFile(filepath.Join(s.cg.dir(ctl), file))
		if err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s = %q (%v), want %s", file, b, err, v)
		}
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	if st := s.ExitStatus(); st.Signal != syscall.SIGKILL || st.OOMKilled {
		t.Errorf("exit status after Kill: %+v", st)
	}
}

// TestForkBomb checks that a fork bomb stays within the pids limit, the host
// keeps working, and Destroy clears it up quickly.
func TestForkBomb(t *testing.T) {
	m := newTestManager(t)
	// Every process forks as fast as it can, forever, shrugging off
	// failures (a shell would exit on its first failed fork).
	uid := testUID()
	spec := Spec{
		ID: "forkbomb", UID: uid, GID: uid,
		Argv: []string{"/usr/bin/python3", "-c", `
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
`},
		Limits: Limits{MemoryMB: 512, Pids: 32},
	}
	s, err := m.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	read := func(file, key string) int {
		b, _ := os.ReadFile(filepath.Join(s.cg.dir("pids"), file))
		if key != "" {
			n, _ := parseKeyed(b, key)
			return int(n)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	testenv.Eventually(t, 10*time.Second, "the fork bomb to reach pids.max = 32 and have forks refused", func() bool {
		return read("pids.current", "") == 32 && read("pids.events", "max") > 0
	})
	for range 10 {
		if n := read("pids.current", ""); n > 32 {
			t.Fatalf("pids.current = %d, above the limit of 32", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "/bin/sh", "-c", "echo host-ok").Output(); err != nil || string(out) != "host-ok\n" {
		t.Errorf("host cannot run a process during the fork bomb: %q, %v", out, err)
	}
	start := time.Now()
	if err := s.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	t.Logf("destroyed the fork bomb in %v", time.Since(start))
	for _, d := range s.cg.dirs {
		if exists(d) {
			t.Errorf("cgroup %s still exists", d)
		}
	}
}

// TestKillRemovesTree checks that Kill takes down every process of the
// sandbox, not just its pid 1.
func TestKillRemovesTree(t *testing.T) {
	m := newTestManager(t)
	spec := shSpec("killtree", `sleep 1000 & sleep 1000 & (sleep 1000 &) ; echo ready; wait`)
	s, _, _ := startCaptured(t, m, spec)
	var pids []int
	testenv.Eventually(t, 10*time.Second, "4 processes in the sandbox", func() bool {
		b, err := os.ReadFile(filepath.Join(s.cg.dir("pids"), "cgroup.procs"))
		if err != nil {
			return false
		}
		pids = pids[:0]
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			pids = append(pids, n)
		}
		return len(pids) == 4
	})
	if !slices.Contains(pids, s.Pid()) {
		t.Errorf("cgroup.procs %v lacks the init %d", pids, s.Pid())
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("sandbox did not exit after Kill")
	}
	for _, p := range pids {
		if err := syscall.Kill(p, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d survived Kill (kill 0: %v)", p, err)
		}
	}
	if err := s.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
}

// TestDestroy checks that Destroy removes the cgroups and state dir, and is
// idempotent.
func TestDestroy(t *testing.T) {
	m := newTestManager(t)
	s, err := m.Start(context.Background(), shSpec("destroy", `sleep 1000`))
	if err != nil {
		t.Fatal(err)
	}
	paths := slices.Clone(s.cg.dirs)
	for _, p := range paths {
		if !exists(p) {
			t.Fatalf("%s does not exist while the sandbox runs", p)
		}
	}
	for i := range 2 {
		if err := s.Destroy(context.Background()); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
	for _, p := range paths {
		if exists(p) {
			t.Errorf("%s still exists after Destroy", p)
		}
	}
	if st := s.ExitStatus(); st.Signal != syscall.SIGKILL {
		t.Errorf("exit status %+v, want SIGKILL", st)
	}
	// The id is free again.
	s2, err := m.Start(context.Background(), shSpec("destroy", `true`))
	if err != nil {
		t.Fatalf("Start after Destroy with the same id: %v", err)
	}
	destroy(t, s2)
}

// TestPrivateTmp checks that one sandbox cannot see another's /tmp.
func TestPrivateTmp(t *testing.T) {
	m := newTestManager(t)
	outR, outW := pipe(t)
	spec := shSpec("tmp-a", `echo secret > /tmp/secret && echo ready; exec sleep 1000`)
	spec.Stdout = outW
	a, err := m.Start(context.Background(), spec)
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, a) })
	line, err := bufio.NewReader(outR).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("sandbox a printed %q (%v)", line, err)
	}
	// /tmp holds only the directory /dev/shm points to.
	o := runSandbox(t, m, shSpec("tmp-b", `ls -A /tmp; cat /proc/*/root/tmp/secret 2>/dev/null; echo done`))
	if o.stdout != ".shm\ndone\n" {
		t.Errorf("sandbox b saw %q", o.stdout)
	}
}

// TestNewManagerCleansStale checks that a new Manager kills the instances
// and removes the cgroups a crashed predecessor left behind.
func TestNewManagerCleansStale(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	old, err := NewManager(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s, err := old.Start(context.Background(), shSpec("stale", `sleep 1000`))
	if err != nil {
		t.Fatal(err)
	}
	// A stray cgroup of a run that crashed between mkdir and start.
	stray := old.cg.instance("stray")
	for _, d := range stray.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// "Crash": forget old and s without destroying them.
	m, err := NewManager(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("NewManager over stale state: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("stale sandbox still runs")
	}
	for _, p := range append(slices.Clone(s.cg.dirs), stray.dirs...) {
		if exists(p) {
			t.Errorf("stale %s was not removed", p)
		}
	}
}

// TestInitFailure checks that failures inside the init surface from Start
// with the failing step, and leave nothing behind.
func TestInitFailure(t *testing.T) {
	m := newTestManager(t)
	tests := []struct {
		name     string
		spec     func(*Spec)
		wantStep string
		wantMsg  string
		class    error
	}{
		{"missing program", func(s *Spec) { s.Argv = []string{"/no/such/program"} }, "exec", "torpor sandbox init: exec: /no/such/program: no such file or directory", errdefs.ErrInvalid},
		{"not executable", func(s *Spec) { s.Argv = []string{"/etc/passwd"} }, "exec", "permission denied", errdefs.ErrInvalid},
		{"missing dir", func(s *Spec) { s.Dir = "/no/such/dir" }, "chdir", "torpor sandbox init: chdir: /no/such/dir: no such file or directory", errdefs.ErrInvalid},
		{"missing bind source", func(s *Spec) { s.Binds = []Bind{{Source: "/no/such/code", Target: "/var/task"}} }, "bind /var/task", "torpor sandbox init: bind /var/task: source /no/such/code: no such file or directory", errdefs.ErrInvalid},
		{"bind target under read-only /usr", func(s *Spec) { s.Binds = []Bind{{Source: "/etc", Target: "/usr/no/such"}} }, "bind /usr/no/such", "read-only file system", errdefs.ErrInvalid},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := shSpec(fmt.Sprintf("fail-%d", i), "true")
			tt.spec(&spec)
			errR, errW := pipe(t)
			spec.Stderr = errW
			s, err := m.Start(context.Background(), spec)
			errW.Close()
			if err == nil {
				destroy(t, s)
				t.Fatal("Start succeeded")
			}
			var ie *InitError
			if !errors.As(err, &ie) || ie.Step != tt.wantStep {
				t.Errorf("error %v: want an InitError at step %q", err, tt.wantStep)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) || !errors.Is(err, tt.class) {
				t.Errorf("error %q: want it to contain %q and match %v", err, tt.wantMsg, tt.class)
			}
			stderr, _ := io.ReadAll(errR)
			if !strings.HasPrefix(string(stderr), "torpor sandbox init: "+tt.wantStep+": ") {
				t.Errorf("init stderr %q", stderr)
			}
			c := m.cg.instance(spec.ID)
			for _, p := range c.dirs {
				if exists(p) {
					t.Errorf("%s left behind", p)
				}
			}
		})
	}
}

// TestStartRejects checks errors returned before anything is started.
func TestStartRejects(t *testing.T) {
	m := newTestManager(t)
	running, err := m.Start(context.Background(), shSpec("dup", "sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, running) })
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name  string
		ctx   context.Context
		spec  func(*Spec)
		class error
	}{
		{"uid 0", context.Background(), func(s *Spec) { s.UID = 0 }, errdefs.ErrInvalid},
		{"gid 0", context.Background(), func(s *Spec) { s.GID = 0 }, errdefs.ErrInvalid},
		{"duplicate id", context.Background(), func(s *Spec) { s.ID = "dup" }, errdefs.ErrConflict},
		{"cancelled context", cancelled, func(s *Spec) {}, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := shSpec("reject", "true")
			tt.spec(&spec)
			s, err := m.Start(tt.ctx, spec)
			if !errors.Is(err, tt.class) {
				t.Errorf("Start: %v, want %v", err, tt.class)
			}
			if s != nil {
				destroy(t, s)
			}
		})
	}
}

// TestMinimumLimits checks that the smallest accepted limits leave the init
// enough room to exec the program.
func TestMinimumLimits(t *testing.T) {
	m := newTestManager(t)
	for i := range 5 {
		spec := shSpec(fmt.Sprintf("min-%d", i), `echo ok`)
		spec.Limits = Limits{MemoryMB: MinMemoryMB, Pids: MinPids, TmpMB: 1, NoFile: 16}
		if o := runSandbox(t, m, spec); o.stdout != "ok\n" || o.status != (ExitStatus{}) {
			t.Fatalf("got %q, %+v, stderr %q", o.stdout, o.status, o.stderr)
		}
	}
}

// TestConcurrentStarts starts sandboxes in parallel, each with its own
// extra file, and checks that none sees another's descriptors.
func TestConcurrentStarts(t *testing.T) {
	m := newTestManager(t)
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		go func() {
			errs <- func() error {
				r, w, err := os.Pipe()
				if err != nil {
					return err
				}
				defer r.Close()
				spec := shSpec(fmt.Sprintf("conc-%d", i), fmt.Sprintf(`echo %d >&3; exec 3>&-; ls /proc/self/fd | wc -l`, i))
				spec.ExtraFiles = []*os.File{w}
				outR, outW, err := os.Pipe()
				if err != nil {
					return err
				}
				defer outR.Close()
				spec.Stdout = outW
				s, err := m.Start(context.Background(), spec)
				w.Close()
				outW.Close()
				if err != nil {
					return err
				}
				defer s.Destroy(context.Background())
				got, _ := io.ReadAll(r)
				out, _ := io.ReadAll(outR)
				<-s.Done()
				// ls sees 0-2 and its own directory fd.
				if string(got) != fmt.Sprintf("%d\n", i) || strings.TrimSpace(string(out)) != "4" {
					return fmt.Errorf("sandbox %d: fd 3 said %q, open fds %q", i, got, out)
				}
				return nil
			}()
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestSharedUID checks that many instances of one function (one uid) run
// side by side: per-instance limits must not be counted per uid.
func TestSharedUID(t *testing.T) {
	m := newTestManager(t)
	uid := testUID()
	for i := range 3 * MinPids {
		spec := shSpec(fmt.Sprintf("shared-%d", i), "exec sleep 1000")
		spec.UID, spec.GID = uid, uid
		spec.Limits.Pids = MinPids
		s, err := m.Start(context.Background(), spec)
		if err != nil {
			t.Fatalf("instance %d of uid %d: %v", i, uid, err)
		}
		t.Cleanup(func() { destroy(t, s) })
	}
}

// TestWorkersLeaveEachOtherAlone checks the default CgroupName: a second
// worker with another StateDir does not take the first one's instances for
// stale, while a restart with the same StateDir does clean them up.
func TestWorkersLeaveEachOtherAlone(t *testing.T) {
	requireRoot(t)
	cfgFor := func(stateDir string) Config {
		cfg := Config{StateDir: stateDir}
		if strings.HasPrefix(testConfig(t).CgroupName, "/") {
			// cgroup v2 under `go test`: see testConfig.
			cfg.CgroupName = "/" + defaultCgroupName(stateDir)
		}
		return cfg
	}
	newManager := func(cfg Config) *Manager {
		m, err := NewManager(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Close(context.Background()); err != nil {
				t.Error(err)
			}
		})
		return m
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	a := newManager(cfgFor(dirA))
	s, err := a.Start(context.Background(), shSpec("worker-a", "exec sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	newManager(cfgFor(dirB))
	select {
	case <-s.Done():
		t.Fatal("a worker with another StateDir killed the first worker's instance")
	case <-time.After(50 * time.Millisecond):
	}
	newManager(cfgFor(dirA)) // a restart of worker A
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a restarted worker did not kill its predecessor's instance")
	}
}

func TestDefaultCgroupName(t *testing.T) {
	a, b := defaultCgroupName("/var/lib/torpor/sandbox"), defaultCgroupName("/home/u/.torpor/sandbox")
	if a != defaultCgroupName("/var/lib/torpor/sandbox") || a == b || !strings.HasPrefix(a, "torpor/") || !validID(strings.TrimPrefix(a, "torpor/")) {
		t.Errorf("default names %q, %q", a, b)
	}
}
