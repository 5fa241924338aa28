package criu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// postDumpGate holds CRIU in its post-dump stage — the dump is complete and
// its image files closed, the tasks not yet killed or let run — until the
// capture has read every image pipe to its end.
//
// CRIU moves the dumpee's memory into the image pipes by reference: the
// parasite vmsplices the pages into a pipe and CRIU splices them on into
// ours, so until the capture reads a page the pipe holds the dumpee's own
// page, not a copy (up to pipeSize of them per file). Whatever CRIU does
// to the dumpee next writes into those pages: killing it makes the kernel
// clear every thread's clear_child_tid word (where glibc keeps the
// thread's id), and letting it run lets it write anywhere. An image read
// after that holds those writes. A process restored with its thread id
// read as 0 fails every rwlock its libraries take: Python's hashlib then
// finds no digest at all and crashes. So the capture must have read it
// all before CRIU moves on.
//
// CRIU runs action scripts (it execs them: the work directory must not be
// mounted noexec) with the stage in CRTOOLS_SCRIPT_ACTION. The gate's
// script, at post-dump only, opens one FIFO to say it is there, then reads
// the verdict from another, which the gate writes once the capture has
// drained: "ok", and the script succeeds. Anything else (the capture
// failed, or the gate was closed) fails the script, and CRIU then fails
// the dump and lets the process run on, as after any failed dump: a call
// whose image could not be captured is not lost with its process.
type postDumpGate struct {
	script           string // its path, for --action-script
	arrived, release string // FIFOs
	done             chan struct{}
	once             sync.Once
}

func newPostDumpGate(dir string) (*postDumpGate, error) {
	g := &postDumpGate{arrived: filepath.Join(dir, "post-dump.arrived"), release: filepath.Join(dir, "post-dump.release"),
		done: make(chan struct{})}
	for _, f := range []string{g.arrived, g.release} {
		if err := unix.Mkfifo(f, 0o600); err != nil {
			return nil, fmt.Errorf("post-dump gate: mkfifo %s: %w", f, err)
		}
	}
	g.script = filepath.Join(dir, "post-dump.sh")
	body := fmt.Sprintf("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n: > %s\n[ \"$(cat %s)\" = %s ]\n",
		shellQuote(g.arrived), shellQuote(g.release), gateOK)
	if err := os.WriteFile(g.script, []byte(body), 0o700); err != nil {
		return nil, fmt.Errorf("post-dump gate: %w", err)
	}
	return g, nil
}

// gateOK is the verdict that lets a dump complete.
const gateOK = "ok"

// run waits for CRIU to reach post-dump, then for drained, then gives the
// script its verdict: the dump completes only if drained returned nil (a
// dump whose image was not read whole must not end as if it were). It
// returns drained's error, once the script has its verdict or close was
// called.
func (g *postDumpGate) run(ctx context.Context, drained func(context.Context) error) error {
	// Open for reading at once: the script's open for writing then
	// returns, and its close shows as a hang-up.
	arrived, err := os.OpenFile(g.arrived, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("post-dump gate: %w", err)
	}
	defer arrived.Close()
	for {
		fds := []unix.PollFd{{Fd: int32(arrived.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, gatePoll); err != nil && err != unix.EINTR {
			return fmt.Errorf("post-dump gate: %w", err)
		} else if n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLIN) != 0 {
			break
		}
		select {
		case <-g.done:
			return nil // CRIU did not get this far
		default:
		}
	}
	derr := drained(ctx)
	if derr != nil {
		derr = fmt.Errorf("post-dump gate: the image was not captured whole: %w", derr)
	}
	verdict := gateOK
	if derr != nil {
		verdict = "fail"
	}
	for {
		// Succeeds once the script waits to read (ENXIO until then).
		w, err := os.OpenFile(g.release, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			_, werr := w.WriteString(verdict) // a few bytes: the FIFO takes them at once
			if cerr := w.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil && derr == nil {
				derr = fmt.Errorf("post-dump gate: %w", werr)
			}
			return derr
		}
		select {
		case <-g.done:
			return derr
		case <-time.After(time.Millisecond):
		}
	}
}

// gatePoll is how often run looks whether it was closed, in ms.
const gatePoll = 50

// close stops run and fails a script still waiting (CRIU is gone, or
// about to be killed).
func (g *postDumpGate) close() {
	g.once.Do(func() {
		close(g.done)
		if w, err := os.OpenFile(g.release, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close() // ENXIO: no script waits
		}
	})
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
