package config

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// envVars are every variable Default reads.
var envVars = []string{"TORPOR_HOME", "TORPOR_LISTEN", "TORPOR_LOG_LEVEL", "TORPOR_NATS", "TORPOR_NATS_LISTEN",
	"TORPOR_NATS_TOKEN", "TORPOR_WORKER_ID", "TORPOR_PYTHON", "TORPOR_AUTH", "TORPOR_API_TOKEN_FILE"}

// clearEnv unsets the TORPOR_* variables for the test (t.Setenv restores them).
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range envVars {
		t.Setenv(k, "")
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDefaultWithoutEnv(t *testing.T) {
	clearEnv(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	c := Default()
	host, _ := os.Hostname()
	want := Config{
		Home: filepath.Join(home, ".torpor"), Listen: "127.0.0.1:8080", LogLevel: "info", Auth: AuthToken,
		AckWait: 30 * time.Second, Retention: 7 * 24 * time.Hour,
		WorkerID: host, Python: "python3", IdleTTL: 10 * time.Minute, MaxIdle: 256,
		Templates: true, TemplateTTL: time.Hour,
		PidsLimit: 128, TmpMB: 512, SandboxNetwork: "none", SnapshotCompression: "zstd",
		EvictionGrace: 30 * time.Second, EvictionPoll: 2 * time.Second,
	}
	if c != want {
		t.Errorf("Default() =\n%+v\nwant\n%+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	if got, want := c.APITokenPath(), filepath.Join(home, ".torpor", "api-token"); got != want {
		t.Errorf("APITokenPath() = %q, want %q", got, want)
	}
}

func TestDefaultEnvOverlay(t *testing.T) {
	clearEnv(t)
	tests := []struct {
		env   string
		value string
		get   func(Config) string
	}{
		{"TORPOR_HOME", "/srv/torpor", func(c Config) string { return c.Home }},
		{"TORPOR_LISTEN", "0.0.0.0:9000", func(c Config) string { return c.Listen }},
		{"TORPOR_LOG_LEVEL", "debug", func(c Config) string { return c.LogLevel }},
		{"TORPOR_NATS", "nats://10.0.0.1:4222", func(c Config) string { return c.NATSURL }},
		{"TORPOR_NATS_LISTEN", "0.0.0.0:4222", func(c Config) string { return c.NATSListen }},
		{"TORPOR_NATS_TOKEN", "s3cret", func(c Config) string { return c.NATSToken }},
		{"TORPOR_WORKER_ID", "node-7", func(c Config) string { return c.WorkerID }},
		{"TORPOR_PYTHON", "/opt/py/bin/python3.12", func(c Config) string { return c.Python }},
		{"TORPOR_AUTH", "none", func(c Config) string { return string(c.Auth) }},
		{"TORPOR_API_TOKEN_FILE", "/etc/torpor/token", func(c Config) string { return c.APITokenFile }},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(tt.env, tt.value)
			if got := tt.get(Default()); got != tt.value {
				t.Errorf("with %s=%q: got %q", tt.env, tt.value, got)
			}
		})
	}
	t.Run("all at once", func(t *testing.T) {
		for _, tt := range tests {
			t.Setenv(tt.env, tt.value)
		}
		c := Default()
		for _, tt := range tests {
			if got := tt.get(c); got != tt.value {
				t.Errorf("%s: got %q, want %q", tt.env, got, tt.value)
			}
		}
	})
	// A variable set to "" overrides the default (except TORPOR_HOME, where
	// empty means unset) — so `TORPOR_WORKER_ID= torpor up` fails validation
	// instead of silently using the host name.
	t.Run("empty value", func(t *testing.T) {
		t.Setenv("TORPOR_WORKER_ID", "")
		t.Setenv("TORPOR_HOME", "")
		c := Default()
		if c.WorkerID != "" {
			t.Errorf("WorkerID = %q, want empty", c.WorkerID)
		}
		if c.Home == "" {
			t.Error("empty TORPOR_HOME left Home empty; want the default")
		}
	})
}

func validConfig() Config {
	return Config{Home: "/tmp/x", Listen: "127.0.0.1:8080", LogLevel: "info", AckWait: 30 * time.Second,
		Retention: time.Hour, WorkerID: "w1", Python: "python3", IdleTTL: time.Minute, MaxIdle: 1,
		PidsLimit: 8, TmpMB: 1, SandboxNetwork: "none", Auth: AuthToken}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"baseline", func(*Config) {}},
		{"listen any host", func(c *Config) { c.Listen = ":8080" }},
		{"listen ipv6", func(c *Config) { c.Listen = "[::1]:8080" }},
		{"external nats", func(c *Config) { c.NATSURL = "nats://127.0.0.1:4222" }},
		{"tls nats", func(c *Config) { c.NATSURL = "tls://nats.example:4222" }},
		{"host network", func(c *Config) { c.SandboxNetwork = "host" }},
		{"log level debug", func(c *Config) { c.LogLevel = "debug" }},
		{"log level warn", func(c *Config) { c.LogLevel = "warn" }},
		{"log level error", func(c *Config) { c.LogLevel = "error" }},
		{"ack wait 1s", func(c *Config) { c.AckWait = time.Second }},
		{"auth none", func(c *Config) { c.Auth = AuthNone }},
		{"token file", func(c *Config) { c.APITokenFile = "/etc/torpor/token" }},
		{"no eviction grace", func(c *Config) { c.EvictionGrace = 0 }},
		{"aws notices", func(c *Config) { c.EvictionNotice, c.EvictionPoll = "aws", time.Second }},
		{"no notices, no poll", func(c *Config) { c.EvictionNotice, c.EvictionPoll = "none", 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			if err := c.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"empty home", func(c *Config) { c.Home = "" }, []string{"--home", "TORPOR_HOME"}},
		{"listen without port", func(c *Config) { c.Listen = "localhost" }, []string{"--listen", `"localhost"`, "HOST:PORT"}},
		{"listen empty", func(c *Config) { c.Listen = "" }, []string{"--listen"}},
		{"bad log level", func(c *Config) { c.LogLevel = "verbose" }, []string{"--log-level", `"verbose"`}},
		{"upper-case log level", func(c *Config) { c.LogLevel = "INFO" }, []string{"--log-level"}},
		{"nats without scheme", func(c *Config) { c.NATSURL = "127.0.0.1:4222" }, []string{"--nats", "nats://"}},
		{"ack wait too short", func(c *Config) { c.AckWait = 999 * time.Millisecond }, []string{"--ack-wait", "1s"}},
		{"idle ttl too short", func(c *Config) { c.IdleTTL = 0 }, []string{"--idle-ttl"}},
		{"pids limit too low", func(c *Config) { c.PidsLimit = 7 }, []string{"--pids-limit", "7"}},
		{"tmp mb zero", func(c *Config) { c.TmpMB = 0 }, []string{"--tmp-mb"}},
		{"sandbox network", func(c *Config) { c.SandboxNetwork = "bridge" }, []string{"--sandbox-network", `"bridge"`}},
		{"empty worker id", func(c *Config) { c.WorkerID = "" }, []string{"--worker-id"}},
		{"negative memory budget", func(c *Config) { c.MemoryBudgetMB = -1 }, []string{"--memory-budget", "-1"}},
		{"unknown auth", func(c *Config) { c.Auth = "basic" }, []string{"--auth", `"basic"`, "token", "none"}},
		{"empty auth", func(c *Config) { c.Auth = "" }, []string{"--auth"}},
		{"upper-case auth", func(c *Config) { c.Auth = "NONE" }, []string{"--auth"}},
		{"negative eviction grace", func(c *Config) { c.EvictionGrace = -time.Second }, []string{"--eviction-grace", "-1s"}},
		{"unknown notice source", func(c *Config) { c.EvictionNotice = "ibm" }, []string{"--eviction-notice", `"ibm"`, "aws"}},
		{"notice poll too fast", func(c *Config) { c.EvictionNotice, c.EvictionPoll = "gcp", 10*time.Millisecond },
			[]string{"--eviction-poll", "10ms", "100ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := validConfig()
	c.Home, c.LogLevel, c.TmpMB, c.WorkerID = "", "loud", 0, ""
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil")
	}
	for _, flag := range []string{"--home", "--log-level", "--tmp-mb", "--worker-id"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("error %q does not mention %s", err, flag)
		}
	}
}

// Values the worker cannot use must be rejected at startup, not crash later:
// --async-slots -1 makes the worker's make(chan, -1) panic, and a negative
// --max-idle evicts every idle instance.
func TestValidateRejectsNegativeCounts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		flag   string
	}{
		{"async slots", func(c *Config) { c.AsyncSlots = -1 }, "--async-slots"},
		{"max idle", func(c *Config) { c.MaxIdle = -1 }, "--max-idle"},
		{"retention", func(c *Config) { c.Retention = -time.Hour }, "--retention"},
	}
	var bugs []string
	for _, tt := range tests {
		c := validConfig()
		tt.mutate(&c)
		err := c.Validate()
		if err == nil {
			bugs = append(bugs, tt.flag)
			continue
		}
		if !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("error %q does not mention %s", err, tt.flag)
		}
	}
	if len(bugs) > 0 {
		t.Skipf("BUG: Config.Validate (config.go) accepts negative %s", strings.Join(bugs, ", "))
	}
}

// realPython returns the real interpreter behind python3 on PATH, or skips.
func realPython(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("needs python3 on PATH: %v", err)
	}
	p, err := filepath.EvalSymlinks(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestResolvePythonThroughShim(t *testing.T) {
	real := realPython(t)
	dir := t.TempDir()
	shim := filepath.Join(dir, "shims", "python3")
	writeScript(t, shim, `exec "`+real+`" "$@"`)
	link := filepath.Join(dir, "bin", "py")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		arg  string
		path string // PATH for the lookup; "" keeps it
	}{
		{"shim by absolute path", shim, ""},
		{"shim by name on PATH", "python3", filepath.Dir(shim)},
		{"symlink", link, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.path != "" {
				t.Setenv("PATH", tt.path)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Cleanup(cancel)
			in, err := ResolvePython(ctx, tt.arg)
			if err != nil {
				t.Fatalf("ResolvePython(%q): %v", tt.arg, err)
			}
			if in.Path == shim || in.Path == link {
				t.Errorf("Path = %q is the shim, not the interpreter", in.Path)
			}
			if in.Path != real {
				t.Errorf("Path = %q, want %q", in.Path, real)
			}
			if !filepath.IsAbs(in.Prefix) {
				t.Errorf("Prefix = %q, want an absolute path", in.Prefix)
			}
			if _, err := os.Stat(filepath.Join(in.Prefix, "lib")); err != nil {
				t.Errorf("Prefix %q has no lib dir: %v", in.Prefix, err)
			}
		})
	}
}

// A shim that execs the interpreter under a bare argv[0] (bash `exec -a`,
// some version managers) makes Python compute sys.executable by searching
// PATH — which finds the shim again.
func TestResolvePythonShimWithBareArgv0(t *testing.T) {
	real := realPython(t)
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash for exec -a")
	}
	dir := t.TempDir()
	shim := filepath.Join(dir, "python3")
	if err := os.WriteFile(shim, []byte("#!"+bash+"\nexec -a python3 \""+real+"\" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	in, err := ResolvePython(ctx, "python3")
	if err != nil {
		t.Fatal(err)
	}
	if in.Path == shim {
		t.Skipf("BUG: ResolvePython (config.go) returns the shim %s: it trusts sys.executable, which Python derives "+
			"from argv[0]+PATH; reading /proc/self/exe (os.readlink) in the probe would find %s", in.Path, real)
	}
	if in.Path != real {
		t.Errorf("Path = %q, want %q", in.Path, real)
	}
}

func TestResolvePythonErrors(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "python2")
	writeScript(t, old, `echo /usr/bin/python2.7; echo /usr; echo 2.7`)
	old37 := filepath.Join(dir, "python37")
	writeScript(t, old37, `echo /usr/bin/python3.7; echo /usr; echo 3.7`)
	junk := filepath.Join(dir, "junk")
	writeScript(t, junk, `echo hello`)
	failing := filepath.Join(dir, "failing")
	writeScript(t, failing, `exit 3`)
	dangling := filepath.Join(dir, "dangling")
	writeScript(t, dangling, `echo `+filepath.Join(dir, "nope")+`; echo /usr; echo 3.11`)
	notExec := filepath.Join(dir, "notexec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		arg  string
		want []string
	}{
		{"missing name", "no-such-python-torpor-test", []string{`"no-such-python-torpor-test"`, "not found", "--python"}},
		{"missing path", filepath.Join(dir, "missing"), []string{"not found", "--python"}},
		{"not executable", notExec, []string{"not found", "--python"}},
		{"python 2", old, []string{"2.7", "3.8 or newer"}},
		{"python 3.7", old37, []string{"3.7", "3.8 or newer"}},
		{"unexpected output", junk, []string{"unexpected answer", "hello"}},
		{"interpreter fails", failing, []string{"run " + failing}},
		{"executable does not exist", dangling, []string{"resolve"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", dir)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Cleanup(cancel)
			_, err := ResolvePython(ctx, tt.arg)
			if err == nil {
				t.Fatalf("ResolvePython(%q) = nil error", tt.arg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestResolvePythonHonoursContext(t *testing.T) {
	dir := t.TempDir()
	slow := filepath.Join(dir, "slow")
	writeScript(t, slow, `exec sleep 30`)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	t.Cleanup(cancel)
	start := time.Now()
	_, err := ResolvePython(ctx, slow)
	if err == nil {
		t.Fatal("ResolvePython of a hanging interpreter returned nil")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ResolvePython took %s after its context expired", d)
	}
}
