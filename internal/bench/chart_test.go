package bench

import (
	"bytes"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestAxisTicks(t *testing.T) {
	tests := []struct {
		name           string
		ax             chartAxis
		lo, hi         float64
		wantLo, wantHi float64
		wantMajor      []float64
	}{
		{"linear from zero", chartAxis{}, 3, 37, 0, 40, []float64{0, 5, 10, 15, 20, 25, 30, 35, 40}},
		{"linear top on a tick moves up", chartAxis{}, 0, 40, 0, 45, []float64{0, 5, 10, 15, 20, 25, 30, 35, 40, 45}},
		{"linear negative", chartAxis{}, -3, 7, -4, 8, []float64{-4, -2, 0, 2, 4, 6, 8}},
		{"linear flat zero", chartAxis{}, 0, 0, 0, 1.2, nil},
		{"log", chartAxis{Log: true}, 0.3, 40, 0.2, 50, []float64{0.2, 0.5, 1, 2, 5, 10, 20, 50}},
		{"fixed ticks", chartAxis{Log: true, Ticks: []float64{64, 128, 256}}, 64, 256, 0, 0, []float64{64, 128, 256}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, major, _ := axisTicks(tc.ax, tc.lo, tc.hi)
			if lo > tc.lo || hi < tc.hi || lo >= hi {
				t.Fatalf("range [%g, %g] does not hold [%g, %g]", lo, hi, tc.lo, tc.hi)
			}
			if tc.wantHi != 0 && (lo != tc.wantLo || hi != tc.wantHi) {
				t.Errorf("range [%g, %g], want [%g, %g]", lo, hi, tc.wantLo, tc.wantHi)
			}
			if tc.wantMajor != nil && !slices.Equal(major, tc.wantMajor) {
				t.Errorf("ticks %v, want %v", major, tc.wantMajor)
			}
		})
	}
}

func TestRenderChart(t *testing.T) {
	red := color.RGBA{0xff, 0, 0, 0xff}
	tests := []struct {
		name  string
		c     chart
		want  []color.RGBA
		error string
	}{
		{"lines on linear axes", chart{Title: "t", X: chartAxis{Label: "deployed"}, Y: chartAxis{Label: "MiB"}, Series: []chartSeries{
			{Label: "a", X: []float64{0, 1, 2, 3}, Y: []float64{5, 6, 8, 9}, Line: true},
			{Label: "b", X: []float64{0, 3}, Y: []float64{0, 30}, Line: true, Dash: DashDashed, Color: red},
		}}, []color.RGBA{Palette[0], red}, ""},
		{"scatter on a log y with markers", chart{Title: "t", X: chartAxis{Label: "s"}, Y: chartAxis{Label: "ms", Log: true},
			Series:  []chartSeries{{Label: "calls", X: []float64{1, 2, 3, 4, 5}, Y: []float64{0.3, 0, 50, 7, 1}, Dot: 3, Color: red}},
			Markers: []chartMarker{{X: 2.5, Label: "phase", Color: Palette[2]}, {X: 4, Dash: DashDotted}},
		}, []color.RGBA{red, Palette[2]}, ""},
		{"nothing to draw", chart{Series: []chartSeries{{Label: "x", X: []float64{1}, Y: []float64{0}}}, Y: chartAxis{Log: true}}, nil, "no points"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := renderChart(&buf, tc.c)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("err = %v, want %q", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if b := img.Bounds(); b.Dx() != PlotWidth || b.Dy() != PlotHeight {
				t.Fatalf("size %v", b)
			}
			seen := map[color.RGBA]int{}
			for y := 0; y < PlotHeight; y++ {
				for x := 0; x < PlotWidth; x++ {
					seen[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
				}
			}
			for _, c := range append(tc.want, black) {
				if seen[c] < 20 {
					t.Errorf("colour %v on %d pixels, want it drawn", c, seen[c])
				}
			}
			if dir := os.Getenv("BENCH_PLOT_DIR"); dir != "" {
				_ = os.WriteFile(filepath.Join(dir, "chart_"+strings.ReplaceAll(tc.name, " ", "_")+".png"), buf.Bytes(), 0o644)
			}
		})
	}
}
