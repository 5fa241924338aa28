package bench

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRenderCDF(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lognormal := func(n int, medianUS float64) []int64 {
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(medianUS * math.Exp(0.4*rng.NormFloat64()))
		}
		return v
	}
	red := color.RGBA{0xff, 0, 0, 0xff}
	tests := []struct {
		name       string
		lines      []PlotLine
		wantColors []color.RGBA // must appear in the image
	}{
		{"two lines, explicit colours and dashes", []PlotLine{
			{Label: "baseline c=1", LatenciesUS: lognormal(1000, 250), Color: Palette[9]},
			{Label: "torpor c=8", LatenciesUS: lognormal(1000, 900), Color: red, Dash: DashDashed},
		}, []color.RGBA{Palette[9], red}},
		{"palette by position", []PlotLine{
			{Label: "a", LatenciesUS: lognormal(50, 100)},
			{Label: "b", LatenciesUS: lognormal(50, 100000)}, // four decades: wide axis
			{Label: "c", LatenciesUS: nil},                   // an empty series is skipped
		}, []color.RGBA{Palette[0], Palette[1]}},
		{"single value", []PlotLine{{Label: "one", LatenciesUS: []int64{1000}, Dash: DashDotted}}, []color.RGBA{Palette[0]}},
		{"sub-microsecond clamps", []PlotLine{{Label: "zero", LatenciesUS: []int64{0, 0, 5}, Dash: DashDashDot}}, []color.RGBA{Palette[0]}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := RenderCDF(&buf, "test plot", tc.lines); err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("not a valid PNG: %v", err)
			}
			if b := img.Bounds(); b.Dx() != PlotWidth || b.Dy() != PlotHeight {
				t.Fatalf("size %v, want %dx%d", b, PlotWidth, PlotHeight)
			}
			seen := map[color.RGBA]int{}
			for y := 0; y < PlotHeight; y++ {
				for x := 0; x < PlotWidth; x++ {
					seen[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
				}
			}
			for _, c := range append(tc.wantColors, black) {
				if seen[c] < 20 {
					t.Errorf("colour %v drawn on %d pixels, want a line of it", c, seen[c])
				}
			}
			if dir := os.Getenv("BENCH_PLOT_DIR"); dir != "" { // to look at them
				_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".png"), buf.Bytes(), 0o644)
			}
		})
	}
}

func TestRenderCDFNoData(t *testing.T) {
	var buf bytes.Buffer
	err := RenderCDF(&buf, "empty", []PlotLine{{Label: "x"}})
	if err == nil || !strings.Contains(err.Error(), "no latencies") {
		t.Fatalf("err = %v, want one saying there is nothing to draw", err)
	}
}

func TestNiceBounds(t *testing.T) {
	tests := []struct {
		v, floor, ceil float64
	}{
		{1, 1, 1},
		{0.25, 0.2, 0.5},
		{0.7, 0.5, 1},
		{3, 2, 5},
		{12, 10, 20},
		{55, 50, 100},
		{0.0013, 0.001, 0.002},
	}
	for _, tc := range tests {
		if got := niceFloor(tc.v); math.Abs(got-tc.floor) > 1e-12 {
			t.Errorf("niceFloor(%g) = %g, want %g", tc.v, got, tc.floor)
		}
		if got := niceCeil(tc.v); math.Abs(got-tc.ceil) > 1e-12 {
			t.Errorf("niceCeil(%g) = %g, want %g", tc.v, got, tc.ceil)
		}
	}
}

func TestLogTicks(t *testing.T) {
	tests := []struct {
		lo, hi     float64
		major      []string
		minorCount int
	}{
		{0.1, 5, []string{"0.1", "0.2", "0.5", "1", "2", "5"}, 0},
		{0.2, 20, []string{"0.2", "0.5", "1", "2", "5", "10", "20"}, 0},
		{0.01, 1000, []string{"0.01", "0.1", "1", "10", "100", "1e+03"}, 10},
	}
	for _, tc := range tests {
		major, minor := logTicks(tc.lo, tc.hi)
		var got []string
		for _, m := range major {
			got = append(got, formatTick(m))
		}
		if !slices.Equal(got, tc.major) || len(minor) != tc.minorCount {
			t.Errorf("logTicks(%g, %g) = %v + %d minor, want %v + %d", tc.lo, tc.hi, got, len(minor), tc.major, tc.minorCount)
		}
	}
}

func TestShortCPU(t *testing.T) {
	tests := map[string]string{
		"Intel(R) Xeon(R) CPU @ 2.20GHz":           "Intel Xeon",
		"AMD EPYC 7B13 64-Core Processor":          "AMD EPYC 7B13 64-Core",
		"Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz": "Intel Core i7-8650U",
		"": "",
	}
	for in, want := range tests {
		if got := shortCPU(in); got != want {
			t.Errorf("shortCPU(%q) = %q, want %q", in, got, want)
		}
	}
}
