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
)

// xyLine is one curve of an x-y plot: points in increasing x.
type xyLine struct {
	Label string
	Color color.RGBA
	Dash  int
	X, Y  []float64
}

// renderXY draws lines on log-log axes (sizes and times both span orders
// of magnitude) as a PlotWidth x PlotHeight PNG, with a marker on every
// measured point, and the key below the x axis like RenderCDF's.
func renderXY(w io.Writer, title, xlabel, ylabel string, lines []xyLine) error {
	xlo, xhi, ylo, yhi := math.Inf(1), 0.0, math.Inf(1), 0.0
	for _, l := range lines {
		for i := range l.X {
			if l.X[i] > 0 && l.Y[i] > 0 {
				xlo, xhi = min(xlo, l.X[i]), max(xhi, l.X[i])
				ylo, yhi = min(ylo, l.Y[i]), max(yhi, l.Y[i])
			}
		}
	}
	if xhi == 0 {
		return errors.New("plot: no points to draw: every run failed")
	}
	xlo, xhi = axisRange(xlo, xhi)
	ylo, yhi = axisRange(ylo, yhi)
	img := image.NewRGBA(image.Rect(0, 0, PlotWidth, PlotHeight))
	draw.Draw(img, img.Bounds(), image.NewUniform(whiteFill), image.Point{}, draw.Src)
	p := &plotter{img: img, left: marginL, right: PlotWidth - marginR, top: marginT, bottom: PlotHeight - marginB - legendHeight(len(lines))}
	logPos := func(v, lo, hi float64, a, b int) int {
		f := (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return a + int(math.Round(f*float64(b-a)))
	}
	px := func(x float64) int { return logPos(x, xlo, xhi, p.left, p.right) }
	py := func(y float64) int { return logPos(y, ylo, yhi, p.bottom, p.top) }

	major, minor := logTicks(xlo, xhi)
	for _, t := range minor {
		p.vline(px(t), gridGrey)
	}
	for _, t := range major {
		x := px(t)
		p.vline(x, gridGrey)
		p.line(x, p.bottom, x, p.bottom+4, black, 1, DashSolid)
		s := plainTick(t)
		p.text(x-textWidth(s)/2, p.bottom+17, s, black)
	}
	major, minor = logTicks(ylo, yhi)
	for _, t := range minor {
		p.hline(py(t), gridGrey)
	}
	for _, t := range major {
		y := py(t)
		p.hline(y, gridGrey)
		p.line(p.left-4, y, p.left, y, black, 1, DashSolid)
		s := plainTick(t)
		p.text(p.left-8-textWidth(s), y+4, s, black)
	}

	legend := make([]PlotLine, len(lines))
	for i, l := range lines {
		legend[i] = PlotLine{Label: l.Label, Color: l.Color, Dash: l.Dash}
		for j := range l.X {
			if l.X[j] <= 0 || l.Y[j] <= 0 {
				continue
			}
			x, y := px(l.X[j]), py(l.Y[j])
			if j > 0 && l.X[j-1] > 0 && l.Y[j-1] > 0 {
				p.line(px(l.X[j-1]), py(l.Y[j-1]), x, y, l.Color, 2, l.Dash)
			}
			for dx := -2; dx <= 2; dx++ {
				for dy := -2; dy <= 2; dy++ {
					p.img.SetRGBA(x+dx, y+dy, l.Color)
				}
			}
		}
	}

	p.rect(p.left, p.top, p.right, p.bottom, black)
	if max := (PlotWidth - 20) / face.Advance; len(title) > max {
		title = title[:max]
	}
	p.text((PlotWidth-textWidth(title))/2, 22, title, black)
	p.text((PlotWidth-textWidth(title))/2+1, 22, title, black)
	p.text((p.left+p.right-textWidth(xlabel))/2, p.bottom+36, xlabel, black)
	p.vtext(16, (p.top+p.bottom)/2, ylabel, black)
	p.legend(legend, p.bottom+marginB)
	if err := png.Encode(w, img); err != nil {
		return fmt.Errorf("plot: encode png: %w", err)
	}
	return nil
}

// plainTick prints a tick value in plain decimal: 0.5, 20, 1000.
func plainTick(v float64) string {
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64) // no float noise: 0.3, not 0.30000000000000004
}
