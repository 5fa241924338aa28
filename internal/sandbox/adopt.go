package sandbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
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
		cg, err := m.cg.create(id, probe.Limits)
		if err != nil {
			return nil, err
		}
		for _, f := range cg.procsFiles() {
			if err := writeCgroupFile(f, strconv.Itoa(pid)); err != nil {
				_ = cg.remove(context.WithoutCancel(ctx))
				return nil, fmt.Errorf("adopt pid %d: join cgroup: %w", pid, err)
			}
		}
		s := &Sandbox{id: id, m: m, proc: proc, cg: cg, done: make(chan struct{}),
			waitProc: func() (syscall.WaitStatus, error) { return <-exited, nil }}
		go s.wait()
		return s, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return s, report, nil
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
