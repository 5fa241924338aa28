package bench

import (
	"image/color"
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
	c := chart{Title: title, X: chartAxis{Label: xlabel, Log: true}, Y: chartAxis{Label: ylabel, Log: true}}
	for _, l := range lines {
		c.Series = append(c.Series, chartSeries{Label: l.Label, Color: l.Color, Dash: l.Dash, X: l.X, Y: l.Y, Line: true, Dot: 5})
	}
	return renderChart(w, c)
}

// plainTick prints a tick value in plain decimal: 0.5, 20, 1000.
func plainTick(v float64) string {
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64) // no float noise: 0.3, not 0.30000000000000004
}
