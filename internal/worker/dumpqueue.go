package worker

import (
	"cmp"
	"context"
	"slices"
	"sync"
)

// dumpQueue bounds the checkpoints of running calls a worker takes at
// once — CRIU, compression and upload are CPU and bandwidth bound, and a
// call moved early is worth more than many moved late — and lets the
// waiting call with the lowest rank go first. An eviction ranks its calls
// smallest first; calls ask to leave all at once, and each waits here,
// handed over and parked, for its turn. A call that defers its hand-over
// (it holds a socket) holds no turn meanwhile.
type dumpQueue struct {
	mu   sync.Mutex
	free int
	seq  uint64
	wait []*dumpWaiter // by rank, then arrival
}

type dumpWaiter struct {
	rank  int
	seq   uint64
	ready chan struct{} // closed when the turn is this waiter's
}

func newDumpQueue(n int) *dumpQueue { return &dumpQueue{free: n} }

// acquire waits for a turn, lowest rank first, until ctx ends. The turn is
// given back with release.
func (q *dumpQueue) acquire(ctx context.Context, rank int) (release func(), err error) {
	q.mu.Lock()
	if q.free > 0 && len(q.wait) == 0 {
		q.free--
		q.mu.Unlock()
		return q.release, nil
	}
	q.seq++
	wt := &dumpWaiter{rank: rank, seq: q.seq, ready: make(chan struct{})}
	i, _ := slices.BinarySearchFunc(q.wait, wt, func(a, b *dumpWaiter) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.seq, b.seq))
	})
	q.wait = slices.Insert(q.wait, i, wt)
	q.mu.Unlock()
	select {
	case <-wt.ready:
		return q.release, nil
	case <-ctx.Done():
		q.mu.Lock()
		defer q.mu.Unlock()
		if i := slices.Index(q.wait, wt); i >= 0 {
			q.wait = slices.Delete(q.wait, i, i+1)
			return nil, ctx.Err()
		}
		// The turn came as ctx ended: pass it on.
		q.releaseLocked()
		return nil, ctx.Err()
	}
}

func (q *dumpQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.releaseLocked()
}

func (q *dumpQueue) releaseLocked() {
	if len(q.wait) == 0 {
		q.free++
		return
	}
	next := q.wait[0]
	q.wait = q.wait[1:]
	close(next.ready)
}
