package worker

import (
	"context"
	"sort"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/procmem"
)

// Summary is what this worker publishes about itself (see api.WorkerSummary).
func (w *Worker) Summary() api.WorkerSummary {
	s := api.WorkerSummary{ID: w.cfg.ID, UpdatedAt: time.Now().UTC().Format(time.RFC3339Nano),
		MemoryBudgetMB: w.cfg.MemoryBudgetMB}
	w.closeMu.RLock()
	s.Draining = w.closing
	w.closeMu.RUnlock()
	byKey := map[string]*api.Holding{}
	get := func(name string, version int) *api.Holding {
		k := poolKey(name, version)
		h := byKey[k]
		if h == nil {
			h = &api.Holding{Function: name, Version: version}
			byKey[k] = h
		}
		return h
	}
	w.mu.Lock()
	s.ReservedMB = w.liveMB
	for _, list := range w.idle {
		for _, in := range list {
			get(in.ver.Name, in.ver.Version).Idle++
		}
	}
	w.mu.Unlock()
	for _, t := range w.functionTemplates() {
		get(t.Name, t.Version).Template = true
	}
	w.running.Range(func(_, _ any) bool { s.Running++; return true })
	for _, h := range byKey {
		s.Holdings = append(s.Holdings, *h)
	}
	sort.Slice(s.Holdings, func(i, j int) bool {
		a, b := s.Holdings[i], s.Holdings[j]
		return a.Function < b.Function || a.Function == b.Function && a.Version < b.Version
	})
	return s
}

// Changed returns a channel that is closed the next time what the worker
// holds (idle instances, templates) changes.
func (w *Worker) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// notifyChangedLocked wakes Changed's waiters (w.mu held).
func (w *Worker) notifyChangedLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// Info is the worker's summary plus the memory of every process it keeps,
// read from /proc/PID/smaps_rollup (a few hundred microseconds per process).
func (w *Worker) Info() api.WorkerInfo {
	info := api.WorkerInfo{WorkerSummary: w.Summary(), LowWatermarkMB: w.cfg.ReclaimLowMB, HighWatermarkMB: w.cfg.ReclaimHighMB}
	info.MemAvailableMB, _ = w.availableMB()
	if rt := w.tmpl.runtime(); rt != nil {
		p := api.ProcessInfo{Kind: "runtime-template", Runtime: rt.Hello.Runtime, ID: "rt-python", Pid: rt.Pid()}
		fillMemory(&p)
		info.Templates = append(info.Templates, p)
	}
	for _, ft := range w.tmpl.list() {
		w.tmpl.mu.Lock()
		last := ft.lastUsed
		w.tmpl.mu.Unlock()
		p := api.ProcessInfo{Kind: "function-template", Function: ft.ver.Name, Version: ft.ver.Version,
			ID: ft.f.Sandbox().ID(), Pid: ft.f.Pid(), LastUsed: last.UTC().Format(time.RFC3339Nano)}
		fillMemory(&p)
		info.Templates = append(info.Templates, p)
	}
	add := func(in *instance, state string) {
		p := api.ProcessInfo{Kind: "instance", Function: in.ver.Name, Version: in.ver.Version, ID: in.id,
			Pid: in.sb.Pid(), State: state, Start: in.start, LastUsed: in.lastUsed.UTC().Format(time.RFC3339Nano)}
		fillMemory(&p)
		info.Instances = append(info.Instances, p)
	}
	w.mu.Lock()
	var idle []*instance
	for _, l := range w.idle {
		idle = append(idle, l...)
	}
	w.mu.Unlock()
	for _, in := range idle {
		add(in, "idle")
	}
	for _, rc := range w.runningCalls() {
		add(rc.in, "busy")
	}
	return info
}

// fillMemory sets p's RSS, PSS and USS (procmem); they stay 0 when they
// cannot be read.
func fillMemory(p *api.ProcessInfo) {
	if m, err := procmem.Read(p.Pid); err == nil {
		p.RSS, p.PSS, p.USS = m.RSS, m.PSS, m.USS
	}
}

// Drop stops the idle instances of a function (version 0: every version)
// and, unless keepTemplates, its function templates, and returns once they
// have exited (at most 5 s). Busy instances finish their calls.
func (w *Worker) Drop(name string, version int, keepTemplates bool) api.DropResult {
	res := api.DropResult{Workers: 1}
	match := func(v function.Version) bool { return v.Name == name && (version == 0 || v.Version == version) }
	w.mu.Lock()
	var victims []*instance
	for _, l := range w.idle {
		for _, in := range l {
			if match(in.ver) {
				victims = append(victims, in)
			}
		}
	}
	for _, in := range victims {
		w.removeIdleLocked(in)
	}
	w.mu.Unlock()
	var gone []<-chan struct{}
	for _, in := range victims {
		w.metrics.instances.WithLabelValues("idle").Dec()
		w.retire(in)
		gone = append(gone, in.sb.Done())
	}
	res.Instances = len(victims)
	if !keepTemplates {
		for _, ft := range w.tmpl.list() {
			if match(ft.ver) {
				w.tmpl.remove(ft)
				gone = append(gone, ft.f.Done())
				res.Templates++
			}
		}
	}
	if res.Instances > 0 || res.Templates > 0 {
		w.notifyChanged()
	}
	waitGone(context.Background(), gone, 5*time.Second)
	return res
}
