package bench

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]int64, 100)
	for i := range hundred {
		hundred[i] = int64(100 - i) // 100..1, unsorted on purpose
	}
	tests := []struct {
		name   string
		values []int64
		p      float64
		want   int64
	}{
		{"empty", nil, 50, 0},
		{"one value", []int64{7}, 50, 7},
		{"one value p99", []int64{7}, 99, 7},
		{"p50 of 1..100", hundred, 50, 50},
		{"p90 of 1..100", hundred, 90, 90},
		{"p99 of 1..100", hundred, 99, 99},
		{"p100 is the max", hundred, 100, 100},
		{"tiny p is the min", hundred, 0.001, 1},
		{"p50 of even count is the lower middle", []int64{4, 1, 3, 2}, 50, 2},
		{"p99 of 10 values is the max", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 1000}, 99, 1000},
		{"p90 of 10 values", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 1000}, 90, 9},
		{"duplicates", []int64{5, 5, 5, 1}, 50, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.values)
			if got := Percentile(tc.values, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %g) = %d, want %d", tc.values, tc.p, got, tc.want)
			}
			if !slices.Equal(before, tc.values) {
				t.Errorf("Percentile reordered its input")
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name      string
		latencies []int64
		failures  int
		elapsed   time.Duration
		want      Summary
	}{
		{"nothing", nil, 0, 0, Summary{}},
		{"only failures", nil, 3, time.Second, Summary{Failures: 3, Throughput: 3}},
		{"four calls", []int64{400, 100, 300, 200}, 0, 2 * time.Second,
			Summary{N: 4, P50US: 200, P90US: 400, P99US: 400, MaxUS: 400, MinUS: 100, MeanUS: 250, Throughput: 2}},
		{"failures count in throughput, not percentiles", []int64{10, 20}, 2, time.Second,
			Summary{N: 2, Failures: 2, P50US: 10, P90US: 20, P99US: 20, MaxUS: 20, MinUS: 10, MeanUS: 15, Throughput: 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summarize(tc.latencies, tc.failures, tc.elapsed); got != tc.want {
				t.Errorf("Summarize = %+v\nwant        %+v", got, tc.want)
			}
		})
	}
}

func TestCDF(t *testing.T) {
	tests := []struct {
		name   string
		values []int64
		want   []CDFPoint
	}{
		{"empty", nil, nil},
		{"one", []int64{3}, []CDFPoint{{3, 1}}},
		{"distinct", []int64{3, 1, 2, 4}, []CDFPoint{{1, 0.25}, {2, 0.5}, {3, 0.75}, {4, 1}}},
		{"ties step once", []int64{2, 1, 2, 2}, []CDFPoint{{1, 0.25}, {2, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CDF(tc.values)
			if !slices.Equal(got, tc.want) {
				t.Errorf("CDF(%v) = %v, want %v", tc.values, got, tc.want)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		a, b int64
		want float64
	}{{300, 100, 3}, {50, 100, 0.5}, {100, 0, 0}, {0, 100, 0}}
	for _, tc := range tests {
		if got := Ratio(tc.a, tc.b); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Ratio(%d, %d) = %g, want %g", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParseServerTiming(t *testing.T) {
	tests := []struct {
		in                   string
		wantStart, wantHandl time.Duration
	}{
		{"start;dur=0.412, handler;dur=3.150", 412 * time.Microsecond, 3150 * time.Microsecond},
		{"handler;dur=1", -1, time.Millisecond},
		{"", -1, -1},
		{"start;desc=x;dur=2, handler;dur=oops", 2 * time.Millisecond, -1},
	}
	for _, tc := range tests {
		s, h := parseServerTiming(tc.in)
		if s != tc.wantStart || h != tc.wantHandl {
			t.Errorf("parseServerTiming(%q) = %v, %v; want %v, %v", tc.in, s, h, tc.wantStart, tc.wantHandl)
		}
	}
}
