package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// progressBar draws "verb [#####-----]  45%  123.4/270.0 MiB  85.3 MiB/s"
// on a terminal, redrawn at most every 100 ms; on anything else it prints
// a line at each further 25 %, so logs stay readable.
type progressBar struct {
	w       io.Writer
	verb    string
	tty     bool
	start   time.Time
	last    time.Time
	lastPct int
}

func newProgressBar(w io.Writer, verb string) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		tty = err == nil
	}
	return &progressBar{w: w, verb: verb, tty: tty, start: time.Now(), lastPct: -1}
}

// update is a progress callback: done of total bytes (total < 0: unknown).
func (p *progressBar) update(done, total int64) {
	now := time.Now()
	final := total >= 0 && done >= total
	pct := -1
	if total > 0 {
		pct = int(done * 100 / total)
	}
	if p.tty {
		if !final && now.Sub(p.last) < 100*time.Millisecond {
			return
		}
	} else if pct < 0 || pct/25 == p.lastPct/25 && !final || pct == p.lastPct {
		return
	}
	p.last, p.lastPct = now, pct
	rate := float64(done) / (1 << 20) / max(now.Sub(p.start).Seconds(), 1e-3)
	line := fmt.Sprintf("%s %s  %.1f MiB/s", p.verb, sizeOf(done, total), rate)
	if pct >= 0 {
		const width = 30
		fill := pct * width / 100
		line = fmt.Sprintf("%s [%s%s] %3d%%  %s  %.1f MiB/s", p.verb, strings.Repeat("#", fill), strings.Repeat("-", width-fill), pct, sizeOf(done, total), rate)
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", line)
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, line)
}

func sizeOf(done, total int64) string {
	if total < 0 {
		return fmt.Sprintf("%.1f MiB", float64(done)/(1<<20))
	}
	return fmt.Sprintf("%.1f/%.1f MiB", float64(done)/(1<<20), float64(total)/(1<<20))
}
