// Package criu is the CRIU implementation of snapshot.Engine. It runs the
// criu binary (the distribution's, or the one the install script unpacks
// into a private prefix when the distribution's is too old) as a child
// process per dump or restore, streams dumps through CRIU's image-streamer
// socket, and puts CRIU's own log into every error.
package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// DefaultPrefix is where scripts/install-criu.sh unpacks CRIU when the
// distribution's cannot be used.
const DefaultPrefix = "/usr/local/lib/torpor-criu"

// Engine runs CRIU. Construct it with New.
type Engine struct {
	argv    []string // how to run criu, e.g. [loader --library-path L criu]
	source  string
	version string
}

var _ snapshot.Engine = (*Engine)(nil)

// New finds CRIU: path (a criu binary or wrapper) if given, else the
// private prefix if it holds one, else criu on PATH. It fails when none
// runs.
func New(ctx context.Context, path, prefix string) (*Engine, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var cands []*Engine
	if path != "" {
		cands = append(cands, &Engine{argv: []string{path}, source: "configured " + path})
	} else {
		libs := filepath.Join(prefix, "usr/lib/x86_64-linux-gnu")
		loader := filepath.Join(libs, "ld-linux-x86-64.so.2")
		bin := filepath.Join(prefix, "usr/sbin/criu")
		if fileExists(loader) && fileExists(bin) {
			// Run through the prefix's own loader and libraries: the
			// binary needs a newer glibc than the host's, and
			// --library-path (unlike LD_LIBRARY_PATH) does not leak into
			// the programs CRIU runs (tar, ip).
			cands = append(cands, &Engine{argv: []string{loader, "--library-path", libs, bin}, source: "private prefix " + prefix})
		}
		if p, err := exec.LookPath("criu"); err == nil {
			cands = append(cands, &Engine{argv: []string{p}, source: "system " + p})
		}
	}
	var errs []error
	for _, e := range cands {
		v, err := e.readVersion(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.version = v
		return e, nil
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("criu not found (looked in %s and on PATH): install it with scripts/install-criu.sh: %w", prefix, errdefs.ErrUnavailable)
	}
	return nil, fmt.Errorf("no usable criu: %w: %w", errors.Join(errs...), errdefs.ErrUnavailable)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

var versionRE = regexp.MustCompile(`Version:\s*([0-9][0-9.]*)`)

func (e *Engine) readVersion(ctx context.Context) (string, error) {
	out, err := e.command(ctx, nil, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", e.argv[len(e.argv)-1], err, bytes.TrimSpace(out))
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: cannot parse %q", e.argv[len(e.argv)-1], out)
	}
	return string(m[1]), nil
}

// Version is CRIU's version, e.g. "4.2.1".
func (e *Engine) Version() string { return e.version }

// Info implements snapshot.Engine: it runs `criu check`.
func (e *Engine) Info(ctx context.Context) (snapshot.EngineInfo, error) {
	info := snapshot.EngineInfo{Name: "criu", Version: e.version, Path: strings.Join(e.argv, " "), Source: e.source}
	out, err := e.command(ctx, nil, "check").CombinedOutput()
	if err != nil {
		info.Check = fmt.Errorf("criu check: %w: %s", err, lastLines(string(out), 10))
	}
	return info, nil
}

func (e *Engine) command(ctx context.Context, prefix []string, args ...string) *exec.Cmd {
	argv := append(append([]string(nil), e.argv...), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if len(prefix) > 1 {
		// prefix = [binary, its argv[0], args...]: run the binary with
		// the engine's command line appended to its own.
		cmd.Path = prefix[0]
		cmd.Args = append(append([]string(nil), prefix[1:]...), argv...)
	}
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	// CRIU must not outlive a worker that dies mid-dump: a half-dumped
	// tree stays frozen until CRIU lets go of it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// On cancellation let CRIU unfreeze the tree and clean up first.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// mountArgs turns external bind mounts into --external options: at dump
// time mnt[TARGET]:KEY, at restore time mnt[KEY]:SOURCE.
func mountArgs(ms []snapshot.Mount, restore bool) ([]string, error) {
	var args []string
	for _, m := range ms {
		if !validKey(m.Key) {
			return nil, fmt.Errorf("mount key %q: use [a-z0-9-] only: %w", m.Key, errdefs.ErrInvalid)
		}
		if restore {
			if !filepath.IsAbs(m.Source) {
				return nil, fmt.Errorf("mount %s: source %q must be absolute: %w", m.Key, m.Source, errdefs.ErrInvalid)
			}
			args = append(args, "--external", "mnt["+m.Key+"]:"+m.Source)
		} else {
			if !filepath.IsAbs(m.Target) || strings.ContainsAny(m.Target, "[]:") {
				return nil, fmt.Errorf("mount %s: target %q must be absolute without [ ] or ':': %w", m.Key, m.Target, errdefs.ErrInvalid)
			}
			args = append(args, "--external", "mnt["+m.Target+"]:"+m.Key)
		}
	}
	return args, nil
}

func validKey(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// commonArgs are the options every dump and restore of a sandbox needs.
var commonArgs = []string{
	// The instance's network namespace has only loopback: nothing outside
	// can send it packets, so there is nothing to lock out. (Locking
	// needs iptables or nftables tooling, and the instance's own
	// connections are frozen with it anyway.)
	"--network-lock", "skip",
	// Cgroups are the worker's business: a restored instance gets the
	// limits of the worker restoring it, not those recorded in the image.
	"--manage-cgroups=ignore",
	"--file-locks",
	"-v4",
}

// Checkpoint implements snapshot.Engine.
func (e *Engine) Checkpoint(ctx context.Context, spec snapshot.CheckpointSpec, sink snapshot.ImageSink) (snapshot.CheckpointStats, error) {
	if spec.Pid <= 0 {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint: pid %d: %w", spec.Pid, errdefs.ErrInvalid)
	}
	mounts, err := mountArgs(spec.Mounts, false)
	if err != nil {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint pid %d: %w", spec.Pid, err)
	}
	dir, err := os.MkdirTemp(spec.WorkDir, "dump-")
	if err != nil {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint pid %d: %w", spec.Pid, err)
	}
	defer os.RemoveAll(dir)
	capt, err := listenCapture(dir, sink)
	if err != nil {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint pid %d: %w", spec.Pid, err)
	}
	defer capt.close()
	gate, err := newPostDumpGate(dir)
	if err != nil {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint pid %d: %w", spec.Pid, err)
	}

	args := []string{"dump", "--tree", strconv.Itoa(spec.Pid), "--images-dir", dir, "--work-dir", dir,
		"--log-file", "dump.log", "--stream", "--action-script", gate.script}

	if spec.LeaveRunning {
		args = append(args, "--leave-running")
	}
	args = append(append(args, commonArgs...), mounts...)

	start := time.Now()
	cmd := e.command(ctx, spec.ExecPrefix, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return snapshot.CheckpointStats{}, fmt.Errorf("checkpoint pid %d: start criu: %w", spec.Pid, err)
	}
	serveCtx, cancelServe := context.WithCancel(ctx)
	serveErr := make(chan error, 1)
	go func() { serveErr <- capt.serve(serveCtx) }()
	gateErr := make(chan error, 1)
	go func() { gateErr <- gate.run(serveCtx, capt.drained) }()
	werr := cmd.Wait()
	gate.close()
	if werr != nil {
		cancelServe() // CRIU may have died before connecting
	}
	gerr := <-gateErr
	serr := <-serveErr
	cancelServe()
	if serr == nil {
		serr = gerr
	}
	st := snapshot.CheckpointStats{Duration: time.Since(start), Bytes: capt.bytes}
	if werr != nil {
		ferr := failure(ctx, "dump of pid "+strconv.Itoa(spec.Pid), filepath.Join(dir, "dump.log"), werr, out.String())
		if gerr != nil { // the gate failed the dump: the capture's error says why
			ferr = fmt.Errorf("%w (%v)", ferr, gerr)
		}
		return st, ferr
	}
	if serr != nil {
		return st, fmt.Errorf("checkpoint pid %d: %w", spec.Pid, serr)
	}
	return st, nil
}

// Restore implements snapshot.Engine.
func (e *Engine) Restore(ctx context.Context, spec snapshot.RestoreSpec) (snapshot.RestoreStats, error) {
	mounts, err := mountArgs(spec.Mounts, true)
	if err != nil {
		return snapshot.RestoreStats{}, fmt.Errorf("restore: %w", err)
	}
	dir, err := os.MkdirTemp(spec.WorkDir, "restore-")
	if err != nil {
		return snapshot.RestoreStats{}, fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(dir)
	pidFile := filepath.Join(dir, "pid")
	args := []string{"restore", "--images-dir", spec.ImagesDir, "--work-dir", dir, "--log-file", "restore.log",
		"--root", spec.Root, "--pidfile", pidFile,
		// Detached, as a sibling: the restored root becomes a child of
		// the worker (CRIU's parent), which waits for it like any
		// sandbox it started itself.
		"--restore-detached", "--restore-sibling"}
	if spec.EmptyNetwork {
		args = append(args, "--empty-ns", "net")
	}
	args = append(args, mounts...)
	start := time.Now()
	if err := e.Run(ctx, spec.ExecPrefix, filepath.Join(dir, "restore.log"), args...); err != nil {
		return snapshot.RestoreStats{}, err
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return snapshot.RestoreStats{}, fmt.Errorf("restore: criu succeeded but wrote no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return snapshot.RestoreStats{}, fmt.Errorf("restore: bad pid file %q", b)
	}
	return snapshot.RestoreStats{Pid: pid, Duration: time.Since(start)}, nil
}

// Run runs `criu ARGS` with the options torpor gives every dump and
// restore of a sandbox, through prefix (see snapshot.RestoreSpec.ExecPrefix).
// logPath is CRIU's log (pass it in ARGS as --log-file, relative to
// --work-dir, or absolute): a failure carries its error lines.
func (e *Engine) Run(ctx context.Context, prefix []string, logPath string, args ...string) error {
	cmd := e.command(ctx, prefix, append(args, commonArgs...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return failure(ctx, args[0], logPath, err, string(out))
	}
	return nil
}

// failure builds the error of a failed CRIU run: CRIU's error lines and
// the end of its log, which say what it could not handle.
func failure(ctx context.Context, what, logPath string, err error, out string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("criu %s: %w", what, ctx.Err())
	}
	log, _ := os.ReadFile(logPath)
	var errLines []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "Error") || strings.Contains(l, "Warn") {
			errLines = append(errLines, strings.TrimSpace(l))
		}
	}
	if len(errLines) > 15 {
		errLines = errLines[len(errLines)-15:]
	}
	msg := strings.Join(errLines, "\n  ")
	if msg == "" {
		msg = lastLines(string(log)+out, 15)
	}
	return fmt.Errorf("criu %s failed (%v):\n  %s", what, err, msg)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n  ")
}
