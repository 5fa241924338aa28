package criu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/snapshot"
)

// The capture side of CRIU's image-streamer protocol (criu --stream). CRIU
// connects to images-dir/streamer-capture.sock; for every image file it
// opens it sends the file name (a 4-byte little-endian length and a
// protobuf img_streamer_request_entry{1: string filename}) followed by one
// byte carrying, as SCM_RIGHTS, the read end of a pipe it then writes the
// file into. Several files are open at once (pagemap-N.img and pages-N.img
// interleave), so every pipe is drained by its own goroutine. The image
// never touches a disk: this is what lets dump → compress → upload run as
// one pipeline.

const captureSocketName = "streamer-capture.sock"

// maxRequest bounds a file-name request: names are short ("pages-1.img").
const maxRequest = 4096

// pipeSize is the capacity asked for each image pipe, and the size of the
// reads from it: a few large copies instead of many 32 KiB ones through
// the archive, compressor and upload stages.
const pipeSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, pipeSize); return &b }}

// capture serves one CRIU dump on dir/streamer-capture.sock.
type capture struct {
	ln   *net.UnixListener
	sink snapshot.ImageSink

	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
	bytes int64
	conn  *net.UnixConn   // CRIU's, once accepted
	req   *fdReader       // reads conn
	files []chan struct{} // one per image file, closed once it is read to its end
}

func listenCapture(dir string, sink snapshot.ImageSink) (*capture, error) {
	addr := &net.UnixAddr{Name: filepath.Join(dir, captureSocketName), Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("image streamer: %w", err)
	}
	return &capture{ln: ln, sink: sink}, nil
}

func (c *capture) fail(err error) {
	c.errMu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.errMu.Unlock()
}

// serve accepts CRIU's one connection and handles its requests until CRIU
// closes it, then waits for every file to be drained. It returns the first
// error of any file. Cancelling ctx (or close) stops it.
func (c *capture) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.ln.Close() })
	defer stop()
	conn, err := c.ln.AcceptUnix()
	c.ln.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("image streamer: accept: %w", err)
	}
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	defer conn.Close()
	r := &fdReader{conn: conn}
	c.errMu.Lock()
	c.conn, c.req = conn, r
	c.errMu.Unlock()
	rerr := c.readRequests(r)
	c.wg.Wait()
	if rerr != nil {
		c.fail(rerr)
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.err
}

// close stops a capture whose CRIU never connected.
func (c *capture) close() { c.ln.Close() }

// drained waits until every image file CRIU has asked for is read to its
// end, and returns the capture's first error: it is called while CRIU
// waits in its post-dump stage (see postDumpGate), when every request it
// made is in the socket and every file it wrote is closed.
func (c *capture) drained(ctx context.Context) error {
	for {
		c.errMu.Lock()
		r, conn := c.req, c.conn
		c.errMu.Unlock()
		if conn != nil {
			n := unread(conn)
			if n < 0 {
				return errors.New("image streamer: cannot tell whether CRIU's requests were all read")
			}
			// In this order: CRIU sends nothing more once at post-dump, so
			// a socket found empty and then a reader found parked means
			// every request was read and handed out (fdReader.waiting).
			if n == 0 && r.waiting.Load() {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	c.errMu.Lock()
	files := slices.Clone(c.files)
	c.errMu.Unlock()
	for _, done := range files {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.err
}

// unread is how many bytes wait in conn's receive queue (-1 if unknown).
func unread(conn *net.UnixConn) int {
	rc, err := conn.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	_ = rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n = v
		}
	})
	return n
}

// readRequests reads (request, fd) pairs until EOF.
func (c *capture) readRequests(r *fdReader) error {
	defer r.closeFds()
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("image streamer: read request: %w", err)
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n == 0 || n > maxRequest {
			return fmt.Errorf("image streamer: request of %d bytes", n)
		}
		msg := make([]byte, n+1) // + the byte that carries the pipe
		if _, err := io.ReadFull(r, msg); err != nil {
			return fmt.Errorf("image streamer: read request: %w", err)
		}
		name, err := parseRequest(msg[:n])
		if err != nil {
			return err
		}
		fd, ok := r.takeFd()
		if !ok {
			return fmt.Errorf("image streamer: request for %s came without a pipe", name)
		}
		// A bigger pipe lets CRIU hand over more pages per system call
		// (the default is 64 KiB); best effort, the limit is a sysctl.
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeSize)
		pipe := os.NewFile(uintptr(fd), name)
		w, err := c.sink.Open(name)
		if err != nil {
			pipe.Close()
			return fmt.Errorf("image streamer: %s: %w", name, err)
		}
		done := make(chan struct{})
		c.errMu.Lock()
		c.files = append(c.files, done)
		c.errMu.Unlock()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer close(done)
			defer pipe.Close()
			buf := copyBufs.Get().(*[]byte)
			n, err := io.CopyBuffer(w, struct{ io.Reader }{pipe}, *buf) // not File.WriteTo: it would pick its own small buffer
			copyBufs.Put(buf)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			c.errMu.Lock()
			c.bytes += n
			c.errMu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("image streamer: %s: %w", name, err))
			}
		}()
	}
}

// parseRequest decodes img_streamer_request_entry, whose only field is
// `required string filename = 1`.
func parseRequest(b []byte) (string, error) {
	var name string
	found := false
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return "", errors.New("image streamer: malformed request")
		}
		b = b[n:]
		switch key & 7 {
		case 0:
			_, n = binary.Uvarint(b)
			if n <= 0 {
				return "", errors.New("image streamer: malformed request")
			}
			b = b[n:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return "", errors.New("image streamer: malformed request")
			}
			if key>>3 == 1 {
				name, found = string(b[n:n+int(l)]), true
			}
			b = b[n+int(l):]
		default:
			return "", fmt.Errorf("image streamer: unexpected wire type %d in request", key&7)
		}
	}
	if !found || !validImageName(name) {
		return "", fmt.Errorf("image streamer: bad file name %q", name)
	}
	return name, nil
}

// validImageName accepts CRIU's flat image names only.
func validImageName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 255 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// fdReader reads a unix stream with recvmsg, queueing the descriptors
// that arrive with the bytes.
type fdReader struct {
	conn *net.UnixConn
	buf  []byte
	fds  []int
	oob  [128]byte // room for a few SCM_RIGHTS descriptors
	tmp  [512]byte
	// waiting: parked on an empty socket with nothing buffered, so every
	// whole request that arrived so far has been handed out. It is
	// cleared before each receive, never after: a reader seen waiting
	// has consumed nothing it has not handed out (capture.drained).
	waiting atomic.Bool
}

func (r *fdReader) Read(p []byte) (int, error) {
	rc, err := r.conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	for len(r.buf) == 0 {
		var n, oobn int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			r.waiting.Store(false)
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), r.tmp[:], r.oob[:], unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
			if rerr == unix.EAGAIN {
				r.waiting.Store(true)
				return false // park until the socket is readable
			}
			return true
		})
		if err == nil {
			err = rerr
		}
		// A failed read (the connection closed under it, as a cancelled
		// dump does) may report -1.
		n, oobn = max(n, 0), max(oobn, 0)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(r.oob[:oobn])
			if perr == nil {
				for _, m := range msgs {
					if fds, err := unix.ParseUnixRights(&m); err == nil {
						r.fds = append(r.fds, fds...)
					}
				}
			}
		}
		r.buf = append(r.buf, r.tmp[:n]...)
		if n == 0 {
			if err == nil {
				err = io.EOF
			}
			return 0, err
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *fdReader) takeFd() (int, bool) {
	if len(r.fds) == 0 {
		return -1, false
	}
	fd := r.fds[0]
	r.fds = r.fds[1:]
	return fd, true
}

func (r *fdReader) closeFds() {
	for _, fd := range r.fds {
		unix.Close(fd)
	}
	r.fds = nil
}
