package worker

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// Turns go lowest rank first (arrival breaks ties), never more than the
// queue's width at once; a waiter whose context ends leaves the queue
// without taking a turn.
func TestDumpQueue(t *testing.T) {
	q := newDumpQueue(2)
	ctx := context.Background()
	r1, err := q.acquire(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := q.acquire(ctx, 9)
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	start := func(rank int) {
		wg.Go(func() {
			release, err := q.acquire(ctx, rank)
			if err != nil {
				t.Errorf("rank %d: %v", rank, err)
				return
			}
			mu.Lock()
			order = append(order, rank)
			mu.Unlock()
			release()
		})
	}
	waiting := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			q.mu.Lock()
			got := len(q.wait)
			q.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiters, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i, rank := range []int{5, 1, 3} {
		start(rank)
		waiting(i + 1)
	}
	// One that gives up.
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := q.acquire(cctx, 0); gaveUp <- err }()
	waiting(4)
	cancel()
	if err := <-gaveUp; err == nil {
		t.Error("a cancelled waiter got a turn")
	}
	waiting(3)
	r1()
	wg.Wait() // one turn free: the three go one after another
	if !slices.Equal(order, []int{1, 3, 5}) {
		t.Errorf("turns went to ranks %v, want [1 3 5]", order)
	}
	r2()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.free != 2 || len(q.wait) != 0 {
		t.Errorf("after every release: %d free, %d waiting; want 2, 0", q.free, len(q.wait))
	}
}
