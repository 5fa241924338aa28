package bench

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one series' successful call latencies.
// Latencies are in microseconds so that the JSON stays exact and compact.
type Summary struct {
	N        int     `json:"n"`        // successful calls
	Failures int     `json:"failures"` // calls that errored or answered wrongly
	P50US    int64   `json:"p50_us"`
	P90US    int64   `json:"p90_us"`
	P99US    int64   `json:"p99_us"`
	MaxUS    int64   `json:"max_us"`
	MinUS    int64   `json:"min_us"`
	MeanUS   float64 `json:"mean_us"`
	// Throughput is calls (successful or not) per second of wall time of
	// the measured phase.
	Throughput float64 `json:"throughput_per_s"`
}

// Summarize computes the summary of latencies (µs, any order) of the
// successful calls, with failures failed calls, over wall time elapsed.
func Summarize(latencies []int64, failures int, elapsed time.Duration) Summary {
	s := Summary{N: len(latencies), Failures: failures}
	if elapsed > 0 {
		s.Throughput = float64(len(latencies)+failures) / elapsed.Seconds()
	}
	if len(latencies) == 0 {
		return s
	}
	sorted := slices.Clone(latencies)
	slices.Sort(sorted)
	s.P50US = percentileSorted(sorted, 50)
	s.P90US = percentileSorted(sorted, 90)
	s.P99US = percentileSorted(sorted, 99)
	s.MinUS = sorted[0]
	s.MaxUS = sorted[len(sorted)-1]
	var sum float64
	for _, v := range sorted {
		sum += float64(v)
	}
	s.MeanUS = sum / float64(len(sorted))
	return s
}

// Percentile returns the p-th percentile (0 < p <= 100) of values by the
// nearest-rank method: the smallest value such that at least p% of the
// values are less than or equal to it. Unlike interpolation it always
// returns a latency that was actually observed, which is what a tail
// latency claim should rest on. It returns 0 for no values.
func Percentile(values []int64, p float64) int64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	return percentileSorted(sorted, p)
}

func percentileSorted(sorted []int64, p float64) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = max(1, min(n, rank))
	return sorted[rank-1]
}

// CDFPoint is one step of an empirical CDF: Fraction of the values are
// less than or equal to Value.
type CDFPoint struct {
	Value    int64
	Fraction float64
}

// CDF returns the empirical cumulative distribution of values: one point
// per distinct value, in increasing order, the last one at fraction 1.
func CDF(values []int64) []CDFPoint {
	if len(values) == 0 {
		return nil
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	n := float64(len(sorted))
	var pts []CDFPoint
	for i, v := range sorted {
		if i+1 < len(sorted) && sorted[i+1] == v {
			continue // only the last of equal values carries the step
		}
		pts = append(pts, CDFPoint{Value: v, Fraction: float64(i+1) / n})
	}
	return pts
}

// Ratio returns a/b, or 0 when b is 0 (no baseline to compare with).
func Ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
