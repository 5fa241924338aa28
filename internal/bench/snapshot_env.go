package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/miniosrv"
)

// The environment of the snapshot benchmark: its stores (a MinIO it
// starts) and the probes of this process's memory and disk writes.

// openBenchStore opens the store called name with its data under dir; a
// MinIO store starts a MinIO server, which stop stops.
func openBenchStore(ctx context.Context, name, dir, minioBin string) (_ blob.Store, stop func(), err error) {
	switch name {
	case StoreLocal:
		d, err := localdir.New(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("bench snapshot: local store: %w", err)
		}
		return localStore{d}, func() {}, nil
	case StoreMinIO:
		if minioBin == "" {
			var why string
			if minioBin, why = miniosrv.Binary(); minioBin == "" {
				return nil, nil, fmt.Errorf("bench snapshot: %s, pass --minio PATH, or measure --stores local only", why)
			}
		}
		srv, err := miniosrv.Start(ctx, minioBin, dir)
		if err != nil {
			return nil, nil, fmt.Errorf("bench snapshot: %w", err)
		}
		st, err := s3store.New(ctx, s3store.Config{Endpoint: srv.Endpoint, Bucket: "torpor-bench",
			AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PathStyle: true})
		if err == nil {
			err = st.EnsureBucket(ctx)
		}
		if err != nil {
			srv.Stop()
			return nil, nil, fmt.Errorf("bench snapshot: MinIO store at %s: %w", srv.Endpoint, err)
		}
		return minioStore{Store: st, endpoint: srv.Endpoint}, srv.Stop, nil
	}
	return nil, nil, fmt.Errorf("bench snapshot: unknown store %q", name)
}

// localStore and minioStore name their store in messages.
type localStore struct{ *localdir.Dir }

func (s localStore) String() string { return "local dir " + s.Root() + " (" + fsType(s.Root()) + ")" }

type minioStore struct {
	*s3store.Store
	endpoint string
}

func (s minioStore) String() string { return "MinIO at " + s.endpoint + ", " + s.Store.String() }

// rssSampler records the peak VmRSS of this process.
type rssSampler struct {
	base int64
	peak atomic.Int64
	done chan struct{}
	quit chan struct{}
}

// startRSSSampler reads VmRSS now (the base) and then every period.
func startRSSSampler(period time.Duration) *rssSampler {
	s := &rssSampler{done: make(chan struct{}), quit: make(chan struct{})}
	s.base, _ = statusField("/proc/self/status", "VmRSS:")
	s.peak.Store(s.base)
	go func() {
		defer close(s.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-t.C:
				if v, err := statusField("/proc/self/status", "VmRSS:"); err == nil && v > s.peak.Load() {
					s.peak.Store(v)
				}
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the peak's growth over the base.
func (s *rssSampler) stop() int64 {
	close(s.quit)
	<-s.done
	if v, err := statusField("/proc/self/status", "VmRSS:"); err == nil && v > s.peak.Load() {
		s.peak.Store(v)
	}
	return max(s.peak.Load()-s.base, 0)
}

// statusField reads a "Name:   N kB" line of a /proc status file, in bytes.
func statusField(path, name string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseStatusField(b, name)
}

func parseStatusField(b []byte, name string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", name, rest, err)
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s line", name)
}

// ioWriteBytes is write_bytes of /proc/self/io: what this process, and the
// children it has reaped, caused to be written to block devices.
func ioWriteBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	v, err := parseStatusField(b, "write_bytes:")
	if err != nil {
		return 0, errors.New("/proc/self/io: " + err.Error())
	}
	return v, nil
}
