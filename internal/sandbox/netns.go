package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// InetSockets counts the inet (TCP, UDP, raw) sockets in the network
// namespace of pid: a snapshot of a tree without any can have its
// namespace restored empty (see snapshot.LabelNoInetSockets).
func InetSockets(pid int) (int, error) {
	n := 0
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6", "raw", "raw6", "udplite", "udplite6"} {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/" + f)
		if errors.Is(err, os.ErrNotExist) {
			continue // protocol not built into this kernel
		}
		if err != nil {
			return 0, fmt.Errorf("inet sockets of pid %d: %w", pid, err)
		}
		if lines := bytes.Count(b, []byte{'\n'}); lines > 1 {
			n += lines - 1 // the first line is the header
		}
	}
	return n, nil
}

// loopbackUpIn brings up lo in the network namespace of pid, from a
// thread of its own that returns to the worker's namespace afterwards.
func loopbackUpIn(pid int) error {
	target, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return fmt.Errorf("loopback of pid %d: %w", pid, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter: %w", err)
			return
		}
		upErr := loopbackUp()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked, so Go ends it with this goroutine
			// instead of reusing it in the instance's namespace.
			errc <- fmt.Errorf("return to the worker's network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- upErr
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("loopback of pid %d: %w", pid, err)
	}
	return nil
}
