package bench

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Dash styles of a plot line; lines that differ only in concurrency share
// a colour and differ in dash, so a reader can compare like with like.
const (
	DashSolid = iota
	DashDashed
	DashDotted
	DashDashDot
	numDashes
)

// PlotLine is one curve of a latency CDF plot.
type PlotLine struct {
	Label       string
	LatenciesUS []int64
	// Color of the line; the zero value picks one from the palette by the
	// line's position.
	Color color.RGBA
	Dash  int // one of the Dash* styles
}

// Palette is the colours plot lines get by default: Tableau 10, chosen to
// stay distinct for colour-blind readers and in greyscale print.
var Palette = []color.RGBA{
	{0x4e, 0x79, 0xa7, 0xff}, // blue
	{0xf2, 0x8e, 0x2b, 0xff}, // orange
	{0x59, 0xa1, 0x4f, 0xff}, // green
	{0xe1, 0x57, 0x59, 0xff}, // red
	{0xb0, 0x7a, 0xa1, 0xff}, // purple
	{0x9c, 0x75, 0x5f, 0xff}, // brown
	{0x76, 0xb7, 0xb2, 0xff}, // teal
	{0xff, 0x9d, 0xa7, 0xff}, // pink
	{0xed, 0xc9, 0x48, 0xff}, // yellow
	{0x40, 0x40, 0x40, 0xff}, // dark grey
}

// Plot geometry, in pixels.
const (
	PlotWidth  = 1000
	PlotHeight = 600
	marginL    = 70
	marginR    = 20
	marginT    = 36
	marginB    = 48 // tick labels and axis label; the legend comes below
)

var (
	black     = color.RGBA{0, 0, 0, 0xff}
	gridGrey  = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
	markGrey  = color.RGBA{0xa0, 0xa0, 0xa0, 0xff}
	textGrey  = color.RGBA{0x50, 0x50, 0x50, 0xff}
	whiteFill = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

// RenderCDF draws the empirical CDFs of lines (x: latency in ms on a log
// scale, y: fraction of calls at or below it) as a PlotWidth x PlotHeight
// PNG written to w. A log x axis keeps a 0.3 ms baseline and a 30 ms tail
// legible on one plot; the y gridlines at 0.5, 0.9 and 0.99 let a reader
// read the percentiles the tables print off the curves.
func RenderCDF(w io.Writer, title string, lines []PlotLine) error {
	lo, hi := int64(math.MaxInt64), int64(0)
	for _, l := range lines {
		for _, v := range l.LatenciesUS {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if hi == 0 {
		return errors.New("plot: no latencies to draw: every series is empty (did every call fail?)")
	}
	p := newPlotter(len(lines))
	p.xlo, p.xhi = axisRange(float64(max(lo, 1))/1000, float64(hi)/1000)

	// Grid and tick labels.
	major, minor := logTicks(p.xlo, p.xhi)
	p.xGrid(major, minor, p.xpx, formatTick)
	for i := 0; i <= 10; i++ {
		f := float64(i) / 10
		y := p.ypx(f)
		p.hline(y, gridGrey)
		p.line(p.left-4, y, p.left, y, black, 1, DashSolid)
		s := strconv.FormatFloat(f, 'f', 1, 64)
		p.text(p.left-8-textWidth(s), y+4, s, black)
	}
	for _, m := range []struct {
		f     float64
		label string
	}{{0.5, "p50"}, {0.9, "p90"}, {0.99, "p99"}} {
		y := p.ypx(m.f)
		p.line(p.left, y, p.right, y, markGrey, 1, DashDashed)
		p.text(p.left+4, y+12, m.label, textGrey) // below: the top left of a CDF plot is empty
	}

	// Curves, drawn as ECDF steps.
	for i, l := range lines {
		c := l.Color
		if c == (color.RGBA{}) {
			c = Palette[i%len(Palette)]
		}
		pts := CDF(l.LatenciesUS)
		if len(pts) == 0 {
			continue
		}
		px, py := p.xpx(float64(pts[0].Value)/1000), p.ypx(0)
		p.dash = 0
		for _, pt := range pts {
			x, y := p.xpx(float64(pt.Value)/1000), p.ypx(pt.Fraction)
			p.lineTo(px, py, x, py, c, 2, l.Dash)
			p.lineTo(x, py, x, y, c, 2, l.Dash)
			px, py = x, y
		}
	}

	// Frame, labels, legend.
	p.rect(p.left, p.top, p.right, p.bottom, black)
	p.text((PlotWidth-textWidth(title))/2, 22, title, black)
	p.text((PlotWidth-textWidth(title))/2+1, 22, title, black) // poor man's bold
	xl := "latency (ms, log scale)"
	p.text((p.left+p.right-textWidth(xl))/2, p.bottom+36, xl, black)
	p.vtext(16, (p.top+p.bottom)/2, "fraction of calls <= latency", black)
	p.legend(lines, p.bottom+marginB)

	if err := png.Encode(w, p.img); err != nil {
		return fmt.Errorf("plot: encode png: %w", err)
	}
	return nil
}

// axisRange widens [lo, hi] (ms) to the enclosing 1-2-5 ticks, so the
// curves never touch the frame.
func axisRange(lo, hi float64) (float64, float64) {
	if hi <= lo {
		hi = lo * 2
	}
	return niceFloor(lo), niceCeil(hi)
}

var steps = []float64{1, 2, 5}

// niceFloor returns the largest 1-2-5 number (1, 2, 5, 10, 20 ...) <= v.
func niceFloor(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	best := e
	for _, s := range steps {
		if s*e <= v*(1+1e-9) {
			best = s * e
		}
	}
	return best
}

// niceCeil returns the smallest 1-2-5 number >= v.
func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, s := range append(steps, 10) {
		if s*e >= v*(1-1e-9) {
			return s * e
		}
	}
	return 10 * e
}

// logTicks returns the labelled (major) and unlabelled (minor) ticks of a
// log axis over [lo, hi]: every 1-2-5 number when the axis spans at most
// three decades, else only powers of ten labelled and 2, 5 as minor.
func logTicks(lo, hi float64) (major, minor []float64) {
	wide := math.Log10(hi/lo) > 3
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, s := range steps {
			t := s * math.Pow(10, e)
			if t < lo*(1-1e-9) || t > hi*(1+1e-9) {
				continue
			}
			if wide && s != 1 {
				minor = append(minor, t)
			} else {
				major = append(major, t)
			}
		}
	}
	return major, minor
}

// formatTick prints a tick value without float noise: 0.2, 1, 50.
func formatTick(v float64) string {
	return strconv.FormatFloat(v, 'g', 3, 64)
}

type plotter struct {
	img                      *image.RGBA
	left, right, top, bottom int
	xlo, xhi                 float64 // ms
	// dash is the distance drawn so far along the current polyline, so
	// that its dash pattern runs on across the many short CDF steps.
	dash int
}

func (p *plotter) xpx(ms float64) int {
	ms = min(max(ms, p.xlo), p.xhi) // 0 µs would be -Inf on a log axis
	f := (math.Log10(ms) - math.Log10(p.xlo)) / (math.Log10(p.xhi) - math.Log10(p.xlo))
	return p.left + int(math.Round(f*float64(p.right-p.left)))
}

func (p *plotter) ypx(frac float64) int {
	frac = min(max(frac, 0), 1)
	return p.bottom - int(math.Round(frac*float64(p.bottom-p.top)))
}

// newPlotter returns a plotter on a white canvas of the plot size, with
// room below the plot area for a legend of n entries.
func newPlotter(n int) *plotter {
	img := image.NewRGBA(image.Rect(0, 0, PlotWidth, PlotHeight))
	draw.Draw(img, img.Bounds(), image.NewUniform(whiteFill), image.Point{}, draw.Src)
	return &plotter{img: img, left: marginL, right: PlotWidth - marginR, top: marginT, bottom: PlotHeight - marginB - legendHeight(n)}
}

// xGrid draws the vertical grid lines at the minor and major x ticks, and
// a tick mark and label at each major one; px maps a value to a column.
func (p *plotter) xGrid(major, minor []float64, px func(float64) int, label func(float64) string) {
	for _, t := range minor {
		p.vline(px(t), gridGrey)
	}
	for _, t := range major {
		x := px(t)
		p.vline(x, gridGrey)
		p.line(x, p.bottom, x, p.bottom+4, black, 1, DashSolid)
		s := label(t)
		p.text(x-textWidth(s)/2, p.bottom+17, s, black)
	}
}

func (p *plotter) vline(x int, c color.RGBA) { p.line(x, p.top, x, p.bottom, c, 1, DashSolid) }
func (p *plotter) hline(y int, c color.RGBA) { p.line(p.left, y, p.right, y, c, 1, DashSolid) }

func (p *plotter) rect(x0, y0, x1, y1 int, c color.RGBA) {
	p.line(x0, y0, x1, y0, c, 1, DashSolid)
	p.line(x0, y1, x1, y1, c, 1, DashSolid)
	p.line(x0, y0, x0, y1, c, 1, DashSolid)
	p.line(x1, y0, x1, y1, c, 1, DashSolid)
}

// dashOn reports whether the pixel at distance d along a line is inked.
func dashOn(style, d int) bool {
	switch style {
	case DashDashed:
		return d%14 < 9
	case DashDotted:
		return d%6 < 2
	case DashDashDot:
		m := d % 20
		return m < 9 || (m >= 13 && m < 15)
	}
	return true
}

// line draws a width-pixel line from (x0,y0) to (x1,y1) (Bresenham) in
// the given dash style, starting a new dash pattern.
func (p *plotter) line(x0, y0, x1, y1 int, c color.RGBA, width, style int) {
	p.dash = 0
	p.lineTo(x0, y0, x1, y1, c, width, style)
}

// lineTo is line continuing the dash pattern of the previous segment; the
// segment's first pixel is the previous one's last, so it is not counted.
func (p *plotter) lineTo(x0, y0, x1, y1 int, c color.RGBA, width, style int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	p.dash--
	for {
		p.dash++
		if dashOn(style, p.dash) {
			for i := 0; i < width; i++ {
				for j := 0; j < width; j++ {
					p.img.SetRGBA(x0+i, y0+j, c)
				}
			}
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

var face = basicfont.Face7x13

func textWidth(s string) int { return len(s) * face.Advance }

// text draws s with its baseline at y.
func (p *plotter) text(x, y int, s string, c color.RGBA) {
	d := font.Drawer{Dst: p.img, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// vtext draws s rotated a quarter turn anticlockwise, centred on (x, cy).
func (p *plotter) vtext(x, cy int, s string, c color.RGBA) {
	w, h := textWidth(s), face.Height
	tmp := image.NewRGBA(image.Rect(0, 0, w, h))
	d := font.Drawer{Dst: tmp, Src: image.NewUniform(c), Face: face, Dot: fixed.P(0, face.Ascent)}
	d.DrawString(s)
	y0 := cy + w/2
	for sy := 0; sy < h; sy++ {
		for sx := 0; sx < w; sx++ {
			if px := tmp.RGBAAt(sx, sy); px.A != 0 {
				p.img.SetRGBA(x-h/2+sy, y0-sx, px)
			}
		}
	}
}

// Legend geometry: the key sits under the x axis, in two columns, because
// no corner of a CDF plot stays empty for every run: at high concurrency
// the curves cross the lower right, where a key usually goes.
const (
	legendRowH   = 17
	legendSample = 36
	legendCols   = 2
)

func legendRows(n int) int { return (n + legendCols - 1) / legendCols }

// legendHeight is the height the key of n lines takes below the axis label.
func legendHeight(n int) int {
	if n == 0 {
		return 0
	}
	return legendRows(n)*legendRowH + 8
}

// legend draws the key of lines, column by column, so that lines measured
// at one concurrency (consecutive in lines) share a column.
func (p *plotter) legend(lines []PlotLine, y0 int) {
	rows := legendRows(len(lines))
	colW := (p.right - p.left) / legendCols
	for i, l := range lines {
		c := l.Color
		if c == (color.RGBA{}) {
			c = Palette[i%len(Palette)]
		}
		x := p.left + (i/rows)*colW
		y := y0 + (i%rows)*legendRowH + legendRowH/2
		p.line(x, y, x+legendSample, y, c, 2, l.Dash)
		label := l.Label
		if max := (colW - legendSample - 16) / face.Advance; len(label) > max {
			label = label[:max]
		}
		p.text(x+legendSample+8, y+4, label, black)
	}
}
