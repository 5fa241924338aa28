package criu

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair returns both ends of a connected unix stream socket pair.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// The reader hands on bytes and the descriptors that came with them, and
// ends with an error, never a panic, when the connection ends or is
// closed under it (a cancelled dump closes it).
func TestFdReader(t *testing.T) {
	a, b := unixPair(t)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := b.WriteMsgUnix([]byte("hello"), unix.UnixRights(int(f.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	r := &fdReader{conn: a}
	buf := make([]byte, 3)
	if n, err := io.ReadFull(r, buf); err != nil || string(buf[:n]) != "hel" {
		t.Fatalf("ReadFull = %q, %v", buf[:n], err)
	}
	fd, ok := r.takeFd()
	if !ok {
		t.Fatal("the descriptor sent with the bytes is missing")
	}
	unix.Close(fd)
	if _, ok := r.takeFd(); ok {
		t.Error("a second descriptor out of one")
	}
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "lo" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	_ = b.Close()
	if n, err := r.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("after the peer closed: Read = %d, %v; want 0, EOF", n, err)
	}
	_ = a.Close()
	if n, err := r.Read(buf); n != 0 || err == nil {
		t.Errorf("on a closed connection: Read = %d, %v; want 0 and an error", n, err)
	}
}
