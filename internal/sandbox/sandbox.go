package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Sandbox is one running (or exited) instance. Its methods are safe for
// concurrent use.
type Sandbox struct {
	id   string
	m    *Manager
	proc *os.Process
	// waitProc reaps proc: exec.Cmd.Wait for a sandbox the Manager
	// started (it also closes what exec opened), Process.Wait for one
	// restored from a snapshot, the status its template reports for an
	// adopted one.
	waitProc func() (syscall.WaitStatus, error)
	cg       *instanceCgroup
	// rootDir, for a restored sandbox, is the host directory its root is
	// bound from; removed with the sandbox.
	rootDir string

	done   chan struct{}
	status ExitStatus // written before done is closed

	destroyMu sync.Mutex
	destroyed bool
}

// ID returns the instance id.
func (s *Sandbox) ID() string { return s.id }

// Pid returns the host pid of the sandbox's init, which is pid 1 inside and,
// after Start, the instance's program itself.
func (s *Sandbox) Pid() int { return s.proc.Pid }

// Done is closed once the init has exited (and with it, the whole tree).
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// ExitStatus returns how the init ended. It is valid once Done is closed.
func (s *Sandbox) ExitStatus() ExitStatus {
	select {
	case <-s.done:
		return s.status
	default:
		return ExitStatus{}
	}
}

// wait reaps the init and records its exit status.
func (s *Sandbox) wait() {
	ws, err := s.waitProc()
	st := ExitStatus{Code: -1}
	switch {
	case err != nil:
		s.m.log.Warn("cannot wait for sandbox", "instance", s.id, "err", err)
	case ws.Signaled():
		st.Signal = ws.Signal()
	default:
		st.Code = ws.ExitStatus()
	}
	n, err := s.cg.oomKills()
	if err != nil {
		s.m.log.Warn("cannot read sandbox oom counter", "instance", s.id, "err", err)
	}
	st.OOMKilled = n > 0
	s.status = st
	close(s.done)
	s.m.log.Debug("sandbox exited", "instance", s.id, "code", st.Code, "signal", st.Signal, "oom_killed", st.OOMKilled)
}

// waitStatus adapts an os.ProcessState-returning wait to waitProc.
func waitStatus(wait func() (*os.ProcessState, error)) func() (syscall.WaitStatus, error) {
	return func() (syscall.WaitStatus, error) {
		ps, err := wait()
		if ps == nil {
			return 0, err
		}
		ws, ok := ps.Sys().(syscall.WaitStatus)
		if !ok {
			return 0, fmt.Errorf("no wait status in %v", ps)
		}
		return ws, nil
	}
}

// Kill sends SIGKILL to the init; as pid 1 of the PID namespace its death
// takes every other process of the sandbox with it. Killing an exited
// sandbox is not an error.
func (s *Sandbox) Kill() error {
	// os.Process signals through a pidfd, so this cannot hit a reused pid.
	if err := s.proc.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill sandbox %s: %w", s.id, err)
	}
	return nil
}

// Stats reads the instance's memory counters from its cgroup.
func (s *Sandbox) Stats() (Stats, error) {
	st, err := s.cg.stats()
	if err != nil {
		return Stats{}, fmt.Errorf("sandbox %s stats: %w", s.id, err)
	}
	return st, nil
}

// Destroy kills the sandbox, waits for it to exit, and removes its cgroup. It is idempotent; if ctx ends first it returns an error
// wrapping errdefs.ErrTimeout and can be called again.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	if s.destroyed {
		return nil
	}
	if err := s.Kill(); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("destroy sandbox %s: init did not exit: %w (%w)", s.id, errdefs.ErrTimeout, ctx.Err())
	}
	if err := s.cg.remove(ctx); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", s.id, err)
	}
	if s.rootDir != "" {
		// The instance, and with it the mount namespace binding this
		// directory, is gone: its mount points are plain directories now.
		if err := os.RemoveAll(s.rootDir); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", s.id, err)
		}
	}
	s.destroyed = true
	s.m.forget(s.id)
	return nil
}
