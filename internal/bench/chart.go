package bench

import (
	"errors"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"math"
)

// chart is an x-y plot: lines, scatter dots or both, with optional
// vertical markers (events such as bursts), on linear or log axes. It is
// the general form of the plots the benchmarks draw besides CDFs.
type chart struct {
	Title   string
	X, Y    chartAxis
	Series  []chartSeries
	Markers []chartMarker
}

// chartAxis is one axis of a chart.
type chartAxis struct {
	Label string
	// Log makes the axis logarithmic (values <= 0 are not drawn); a
	// linear axis starts at 0 when no value is negative, so that heights
	// compare honestly.
	Log bool
	// Ticks, when set, are the labelled ticks (e.g. the numbers of
	// functions measured); else the axis gets 1-2-5 ticks.
	Ticks []float64
}

// chartSeries is one curve or cloud of points, in the order given.
type chartSeries struct {
	Label string
	Color color.RGBA
	Dash  int
	X, Y  []float64
	Line  bool // join consecutive points
	Dot   int  // side, in pixels, of the square drawn on every point; 0: none
}

// chartMarker is a vertical line across the plot at X, labelled at its
// top when Label is set.
type chartMarker struct {
	X     float64
	Label string
	Color color.RGBA
	Dash  int
}

// scale maps values of one axis to pixels between a and b.
type scale struct {
	log    bool
	lo, hi float64
	a, b   int
}

func (s scale) ok(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && (!s.log || v > 0) }

func (s scale) px(v float64) int {
	v = min(max(v, s.lo), s.hi)
	var f float64
	if s.log {
		f = (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	} else {
		f = (v - s.lo) / (s.hi - s.lo)
	}
	return s.a + int(math.Round(f*float64(s.b-s.a)))
}

// axisTicks returns the range of an axis holding values lo..hi (both
// valid for it) and its labelled (major) and unlabelled (minor) ticks.
func axisTicks(ax chartAxis, lo, hi float64) (rlo, rhi float64, major, minor []float64) {
	if len(ax.Ticks) > 0 {
		for _, t := range ax.Ticks {
			if !ax.Log || t > 0 {
				lo, hi = min(lo, t), max(hi, t)
				major = append(major, t)
			}
		}
		// A margin of 4% of the span on either side keeps the end points
		// off the frame.
		if ax.Log {
			if hi <= lo {
				hi = lo * 2
			}
			m := math.Pow(hi/lo, 0.04)
			return lo / m, hi * m, major, nil
		}
		if hi <= lo {
			hi = lo + 1
		}
		m := 0.04 * (hi - lo)
		return lo - m, hi + m, major, nil
	}
	if ax.Log {
		rlo, rhi = axisRange(lo, hi)
		major, minor = logTicks(rlo, rhi)
		return rlo, rhi, major, minor
	}
	if lo >= 0 {
		lo = 0
	}
	if hi <= lo {
		hi = lo + 1
	}
	step := niceCeil((hi - lo) / 8)
	rlo = math.Floor(lo/step) * step
	rhi = math.Ceil(hi/step-1e-9) * step
	if rhi <= hi { // the top point would sit on the frame
		rhi += step
	}
	for t := rlo; t <= rhi+step/2; t += step {
		major = append(major, math.Round(t/step)*step)
	}
	return rlo, rhi, major, nil
}

// renderChart draws c as a PlotWidth x PlotHeight PNG written to w, with
// the key below the x axis like RenderCDF's.
func renderChart(w io.Writer, c chart) error {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	xs := scale{log: c.X.Log}
	ys := scale{log: c.Y.Log}
	for _, s := range c.Series {
		for i := range min(len(s.X), len(s.Y)) {
			if xs.ok(s.X[i]) && ys.ok(s.Y[i]) {
				xlo, xhi = min(xlo, s.X[i]), max(xhi, s.X[i])
				ylo, yhi = min(ylo, s.Y[i]), max(yhi, s.Y[i])
			}
		}
	}
	if math.IsInf(xhi, -1) {
		return errors.New("plot: no points to draw: every run failed")
	}
	for _, m := range c.Markers {
		if xs.ok(m.X) {
			xlo, xhi = min(xlo, m.X), max(xhi, m.X)
		}
	}
	p := newPlotter(len(c.Series))

	var xmajor, xminor, ymajor, yminor []float64
	xs.lo, xs.hi, xmajor, xminor = axisTicks(c.X, xlo, xhi)
	ys.lo, ys.hi, ymajor, yminor = axisTicks(c.Y, ylo, yhi)
	xs.a, xs.b = p.left, p.right
	ys.a, ys.b = p.bottom, p.top

	p.xGrid(xmajor, xminor, xs.px, plainTick)
	for _, t := range yminor {
		p.hline(ys.px(t), gridGrey)
	}
	for _, t := range ymajor {
		y := ys.px(t)
		p.hline(y, gridGrey)
		p.line(p.left-4, y, p.left, y, black, 1, DashSolid)
		s := plainTick(t)
		p.text(p.left-8-textWidth(s), y+4, s, black)
	}

	// Markers go behind the data; a label sits right of its line, at the
	// top, where a burst's dots (the bottom of a latency plot) are not.
	for _, m := range c.Markers {
		if !xs.ok(m.X) {
			continue
		}
		col := m.Color
		if col == (color.RGBA{}) {
			col = markGrey
		}
		x := xs.px(m.X)
		p.line(x, p.top, x, p.bottom, col, 1, m.Dash)
		if m.Label != "" {
			p.text(x+3, p.top+12, m.Label, textGrey)
		}
	}

	legend := make([]PlotLine, len(c.Series))
	for i, s := range c.Series {
		col := s.Color
		if col == (color.RGBA{}) {
			col = Palette[i%len(Palette)]
		}
		legend[i] = PlotLine{Label: s.Label, Color: col, Dash: s.Dash}
		prev := -1
		for j := range min(len(s.X), len(s.Y)) {
			if !xs.ok(s.X[j]) || !ys.ok(s.Y[j]) {
				prev = -1
				continue
			}
			x, y := xs.px(s.X[j]), ys.px(s.Y[j])
			if s.Line && prev >= 0 {
				p.line(xs.px(s.X[prev]), ys.px(s.Y[prev]), x, y, col, 2, s.Dash)
			}
			prev = j
			for dx := -s.Dot / 2; dx < s.Dot-s.Dot/2; dx++ {
				for dy := -s.Dot / 2; dy < s.Dot-s.Dot/2; dy++ {
					p.img.SetRGBA(x+dx, y+dy, col)
				}
			}
		}
	}

	p.rect(p.left, p.top, p.right, p.bottom, black)
	title := c.Title
	if max := (PlotWidth - 20) / face.Advance; len(title) > max {
		title = title[:max]
	}
	p.text((PlotWidth-textWidth(title))/2, 22, title, black)
	p.text((PlotWidth-textWidth(title))/2+1, 22, title, black)
	p.text((p.left+p.right-textWidth(c.X.Label))/2, p.bottom+36, c.X.Label, black)
	p.vtext(16, (p.top+p.bottom)/2, c.Y.Label, black)
	p.legend(legend, p.bottom+marginB)
	if err := png.Encode(w, p.img); err != nil {
		return fmt.Errorf("plot: encode png: %w", err)
	}
	return nil
}
