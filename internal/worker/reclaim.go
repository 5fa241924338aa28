package worker

import (
	"context"
	"time"
)

// The memory reclaimer (SEUSS keeps thousands of function snapshots per
// node and drops them under pressure): when the host's available memory
// falls below the low watermark it stops idle (hot) instances, least
// recently used first, then function templates that have no live
// instance, least recently used first, until the high watermark is
// available again. It never stops the runtime template or an instance
// serving a call. Acting on MemAvailable, well above the point where the
// kernel would start reclaiming hard or OOM-killing, keeps both from
// happening.

// reclaimer checks the host's memory every 100 ms until ctx ends.
func (w *Worker) reclaimer(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		avail, err := w.availableMB()
		if err != nil || avail >= w.cfg.ReclaimLowMB {
			continue
		}
		n, m := w.reclaim(ctx, w.cfg.ReclaimHighMB-avail)
		w.log.Info("memory reclaimed", "available_mb", avail, "low_mb", w.cfg.ReclaimLowMB,
			"high_mb", w.cfg.ReclaimHighMB, "instances", n, "templates", m)
	}
}

// reclaim stops idle instances, then unused function templates, until
// their memory (their cgroups' usage) adds up to needMB, and waits for them
// to be gone. It returns how many of each it stopped.
func (w *Worker) reclaim(ctx context.Context, needMB int) (instances, templates int) {
	need := int64(needMB) << 20
	w.mu.Lock()
	var victims []*instance
	for _, in := range w.idleByLRULocked() {
		if need <= 0 {
			break
		}
		w.removeIdleLocked(in)
		victims = append(victims, in)
		if st, err := in.sb.Stats(); err == nil {
			need -= int64(st.MemoryBytes)
		}
	}
	w.mu.Unlock()
	for _, in := range victims {
		w.metrics.instances.WithLabelValues("idle").Dec()
		w.metrics.reclaimed.WithLabelValues("instance").Inc()
		w.retire(in)
	}
	var dead []<-chan struct{}
	for _, in := range victims {
		dead = append(dead, in.sb.Done())
	}
	if need > 0 {
		for _, ft := range w.tmpl.list() { // least recently used first
			if need <= 0 {
				break
			}
			w.tmpl.mu.Lock()
			busy := ft.live > 0
			w.tmpl.mu.Unlock()
			if busy {
				continue
			}
			if st, err := ft.f.Sandbox().Stats(); err == nil {
				need -= int64(st.MemoryBytes)
			}
			dead = append(dead, ft.f.Done())
			w.tmpl.remove(ft)
			w.metrics.reclaimed.WithLabelValues("function-template").Inc()
			templates++
		}
	}
	if len(victims) > 0 || templates > 0 {
		w.notifyChanged()
	}
	// Their memory is free once they are gone: wait, so that the next
	// check does not count it again.
	waitGone(ctx, dead, 5*time.Second)
	return len(victims), templates
}

// waitGone waits until every channel in gone is closed (processes have
// exited), for at most d, or until ctx ends.
func waitGone(ctx context.Context, gone []<-chan struct{}, d time.Duration) {
	timeout := time.After(d)
	for _, g := range gone {
		select {
		case <-g:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// availableMB is the memory instances and templates can still take: the
// host's available memory, or what is left below the sandboxes' own limit
// (sandbox.Config.TotalMemoryMB) when that is less.
func (w *Worker) availableMB() (int, error) {
	avail, err := meminfoMB("MemAvailable")
	if err != nil {
		return 0, err
	}
	if room, ok, err := w.sandboxes.MemoryHeadroom(); err == nil && ok {
		avail = min(avail, int(room>>20))
	}
	return avail, nil
}
