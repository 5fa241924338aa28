package notice

import (
	"context"
	"log/slog"
	"time"
)

const (
	// logEvery is how often one error text is logged while it repeats:
	// a metadata service that stays down must not fill the log at the
	// polling rate, but must not fall silent either.
	logEvery = time.Minute
	// maxTexts bounds the remembered error texts; texts that vary (they
	// quote bodies) would otherwise pile up over weeks of polling.
	maxTexts = 64
	// defaultEvery is the interval when Watch is given none: GCP and
	// Azure Spot VMs get 30 seconds' notice, and asking costs a local
	// HTTP request.
	defaultEvery = time.Second
)

// Watch polls src every `every` (a second if every <= 0), starting at
// once, until ctx ends or a notice arrives, and returns the notice.
// Errors (unreachable, 5xx, malformed bodies) are logged with slog at warn
// — at most once per distinct error text per minute — and polling
// continues; it never returns on a poll error. Returns ctx.Err() when ctx
// ends.
func Watch(ctx context.Context, src Source, every time.Duration, log *slog.Logger) (Notice, error) {
	if log == nil {
		log = discard()
	}
	if every <= 0 {
		every = defaultEvery
	}
	lim := newLimiter()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, ok, err := src.Check(ctx)
		if ctx.Err() != nil {
			// Cancelled during the check: its error (if any) says only that.
			return Notice{}, ctx.Err()
		}
		switch {
		case err != nil:
			if repeats, ok := lim.allow(err.Error(), time.Now()); ok {
				attrs := []any{"provider", src.Provider(), "err", err}
				if repeats > 0 {
					attrs = append(attrs, "repeats", repeats) // held back since last logged
				}
				log.Warn("eviction notice check failed; still polling", attrs...)
			}
		case ok:
			return n, nil
		}
		select {
		case <-ctx.Done():
			return Notice{}, ctx.Err()
		case <-t.C:
		}
	}
}

// limiter lets each distinct error text through once per logEvery and
// counts the repeats it held back.
type limiter struct {
	seen map[string]*seenText
}

type seenText struct {
	logged  time.Time
	repeats int // held back since logged
}

func newLimiter() *limiter { return &limiter{seen: map[string]*seenText{}} }

// allow reports whether text may be logged at now, and how many times it
// was held back since it last was.
func (l *limiter) allow(text string, now time.Time) (repeats int, ok bool) {
	if s, found := l.seen[text]; found && now.Sub(s.logged) < logEvery {
		s.repeats++
		return 0, false
	} else if found {
		repeats = s.repeats
	}
	if len(l.seen) >= maxTexts {
		for k, s := range l.seen {
			if now.Sub(s.logged) >= logEvery {
				delete(l.seen, k)
			}
		}
		if len(l.seen) >= maxTexts {
			clear(l.seen) // all recent: a burst of distinct texts; start over
		}
	}
	l.seen[text] = &seenText{logged: now}
	return repeats, true
}
