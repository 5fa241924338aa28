package dispatch

// candidate is one worker holding something of the function version a call
// is for, as the worker directory last described it.
type candidate struct {
	Worker   string
	Idle     int  // idle instances of the version
	Template bool // a function template of the version to fork from
	Running  int  // calls in flight on the worker (all functions)
	// Inflight counts the calls of the version this dispatcher has sent to
	// the worker and not yet seen answered: each may have claimed an idle
	// instance the worker's last summary still counts.
	Inflight int
}

// choose picks the worker a call of one function version goes to, among
// the workers holding something of it: the one with the most idle instances
// not claimed by calls in flight (a hot start), else one with a template (a
// warm fork), else none — "" lets any worker take the call through the
// queue group. Ties go to the least busy worker, then to the smaller id, so
// the choice is deterministic.
func choose(cands []candidate) string {
	var hot, warm *candidate
	for i := range cands {
		c := &cands[i]
		if c.spare() > 0 && (hot == nil || c.spare() > hot.spare() || c.spare() == hot.spare() && c.lessBusy(hot)) {
			hot = c
		}
		if c.Template && (warm == nil || c.lessBusy(warm)) {
			warm = c
		}
	}
	switch {
	case hot != nil:
		return hot.Worker
	case warm != nil:
		return warm.Worker
	}
	return ""
}

// spare is the number of idle instances no call of this dispatcher claims.
func (c *candidate) spare() int { return c.Idle - c.Inflight }

func (c *candidate) lessBusy(o *candidate) bool {
	if a, b := c.Running+c.Inflight, o.Running+o.Inflight; a != b {
		return a < b
	}
	return c.Worker < o.Worker
}
