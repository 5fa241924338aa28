package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Adopt takes charge of a process that a template forked inside a sandbox
// the template built (internal/template): the process gets a cgroup of its
// own, named id, with limits l, and is moved into it; Kill, Stats and
// Destroy then work as for a sandbox Start made. The Manager is not the
// process's parent, so the template that reaps it reports how it ended:
// pass that raw wait status to the returned func (calls after the first
// are ignored). Signals go through a pidfd, never to a reused pid.
func (m *Manager) Adopt(ctx context.Context, id string, pid int, l Limits) (*Sandbox, func(syscall.WaitStatus), error) {
	probe := Spec{ID: id, UID: 1, GID: 1, Argv: []string{"/"}, Limits: l}
	if err := probe.normalize(); err != nil {
		return nil, nil, err
	}
	exited := make(chan syscall.WaitStatus, 1)
	var once sync.Once
	report := func(ws syscall.WaitStatus) { once.Do(func() { exited <- ws }) }
	s, err := m.track("adopt", id, func() (*Sandbox, error) {
		proc, err := os.FindProcess(pid)
		if err != nil {
			return nil, fmt.Errorf("adopt pid %d: %w", pid, err)
		}
		cg := m.pool.take(probe.Limits)
		if cg == nil {
			if cg, err = m.cg.create(id, probe.Limits); err != nil {
				return nil, err
			}
		}
		for _, f := range cg.procsFiles() {
			if err := writeCgroupFile(f, strconv.Itoa(pid)); err != nil {
				_ = cg.remove(context.WithoutCancel(ctx))
				return nil, fmt.Errorf("adopt pid %d: join cgroup: %w", pid, err)
			}
		}
		s := &Sandbox{id: id, m: m, proc: proc, cg: cg, done: make(chan struct{}),
			waitProc: func() (syscall.WaitStatus, error) { return awaitReport(proc, exited) }}
		go s.wait()
		return s, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return s, report, nil
}

// awaitReport waits for the exit status a template reports for proc. As a
// safety net against a report that never comes (the template died between
// reaping and writing, say), it also checks through proc's pidfd every
// second whether the process is gone; gone and still unreported a second
// later, it is taken as killed.
func awaitReport(proc *os.Process, exited <-chan syscall.WaitStatus) (syscall.WaitStatus, error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	goneTicks := 0
	for {
		select {
		case ws := <-exited:
			return ws, nil
		case <-tick.C:
			if err := proc.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) {
				if goneTicks++; goneTicks >= 2 {
					return syscall.WaitStatus(syscall.SIGKILL), nil
				}
			}
		}
	}
}

// SeccompProgram returns the seccomp filter every sandboxed program runs
// under (see seccomp.go) as the kernel's struct sock_filter array: what a
// template installs in the function sandboxes it builds.
func SeccompProgram() ([]byte, error) {
	prog, err := seccompProgram()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.LittleEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.LittleEndian.AppendUint32(out, f.K)
	}
	return out, nil
}

// Manager returns the Manager that runs s.
func (s *Sandbox) Manager() *Manager { return s.m }

// MemoryHeadroom returns how much more memory the sandboxes may use before
// their parent cgroup's limit (Config.TotalMemoryMB), and ok = false when
// no limit is set.
func (m *Manager) MemoryHeadroom() (bytes int64, ok bool, err error) {
	return m.cg.parentHeadroom()
}

// RaiseMemoryLimit raises the memory limit of s's cgroup to mb. A template
// needs it: the pages each forked child touches before the worker moves it
// into its own cgroup stay charged to the template's (the kernel no longer
// moves charges), so its limit grows with its live children.
func (s *Sandbox) RaiseMemoryLimit(mb int) error {
	b := strconv.FormatInt(int64(mb)<<20, 10)
	var files []string
	if s.cg.version == 1 {
		// memory+swap may never be below memory: raise it first.
		if s.m.cg.optional["memsw"] {
			files = append(files, filepath.Join(s.cg.dir("memory"), "memory.memsw.limit_in_bytes"))
		}
		files = append(files, filepath.Join(s.cg.dir("memory"), "memory.limit_in_bytes"))
	} else {
		files = append(files, filepath.Join(s.cg.dir("memory"), "memory.max"))
	}
	for _, f := range files {
		if err := writeCgroupFile(f, b); err != nil {
			return fmt.Errorf("sandbox %s: raise memory limit to %d MB: %w", s.id, mb, err)
		}
	}
	return nil
}
