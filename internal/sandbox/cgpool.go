package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"sync"
)

// cgroupPool keeps a few empty cgroups made in advance for Adopt: making
// one (a directory in each v1 hierarchy) costs a few hundred microseconds,
// most of a warm start's budget, while giving a made one its limits is a
// few writes. Pooled cgroups are named "p-<random>", not after the sandbox
// that takes them; like any cgroup below the parent, leftovers of a crashed
// worker are removed by the next start (cleanStale).
type cgroupPool struct {
	t    *cgroupTree
	size int

	mu      sync.Mutex
	ready   []*instanceCgroup
	filling bool
	closed  bool
}

const cgroupPoolSize = 4

// take returns a pooled cgroup with l applied, or nil when the pool is
// empty; either way it refills the pool in the background.
func (p *cgroupPool) take(l Limits) *instanceCgroup {
	p.mu.Lock()
	var c *instanceCgroup
	if n := len(p.ready); n > 0 {
		c, p.ready = p.ready[n-1], p.ready[:n-1]
	}
	refill := !p.filling && !p.closed
	p.filling = p.filling || refill
	p.mu.Unlock()
	if refill {
		go p.fill()
	}
	if c == nil {
		return nil
	}
	var writes []cgroupWrite
	if p.t.version == 1 {
		writes = v1Writes(l, p.t.optional["memsw"])
	} else {
		writes = v2Writes(l, p.t.optional["swap"])
	}
	for _, w := range writes {
		if err := writeCgroupFile(filepath.Join(c.dir(w.Controller), w.File), w.Value); err != nil {
			c.rmdirs(c.dirs)
			return nil
		}
	}
	return c
}

func (p *cgroupPool) fill() {
	for {
		p.mu.Lock()
		if p.closed || len(p.ready) >= p.size {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		c, err := p.t.create("p-"+hex.EncodeToString(b), Limits{})
		p.mu.Lock()
		if err != nil || p.closed {
			p.filling = false
			p.mu.Unlock()
			if c != nil {
				c.rmdirs(c.dirs)
			}
			return
		}
		p.ready = append(p.ready, c)
		p.mu.Unlock()
	}
}

// close removes the pooled cgroups.
func (p *cgroupPool) close(ctx context.Context) {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, c := range ready {
		_ = c.remove(ctx)
	}
}
