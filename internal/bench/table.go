package bench

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// PrintWarmTable prints the report as tables: latency per series and
// concurrency with ratios to the baseline, then torpor's own account of
// where the time of a median call went (Server-Timing), then failures.
func PrintWarmTable(w io.Writer, rep *WarmReport) {
	wide := len("series")
	for _, s := range rep.Results {
		wide = max(wide, len(s.Series))
	}
	name := func(s string) string { return fmt.Sprintf("%-*s", wide, s) } // left-aligned in a right-aligned table
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tc\tn\tfailed\thot\tp50 ms\tp90 ms\tp99 ms\tmax ms\tmean ms\tcalls/s\tp50/base\tp99/base\t\n", name("series"))
	for _, s := range rep.Results {
		hot, r50, r99 := "-", "-", "-"
		if s.Series != SeriesBaseline {
			hot = strconv.Itoa(s.Hot)
			r50, r99 = ratio(s.RatioP50), ratio(s.RatioP99)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.0f\t%s\t%s\t\n",
			name(s.Series), s.Concurrency, s.N, s.Failures, hot, ms(s.P50US), ms(s.P90US), ms(s.P99US), ms(s.MaxUS),
			s.MeanUS/1000, s.Throughput, r50, r99)
	}
	tw.Flush()

	fmt.Fprintln(w, "\ntorpor's Server-Timing of the same calls, p50 in ms (rest = client latency - start - handler: HTTP, gateway, dispatch, agent protocol):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tc\tlatency\tstart\thandler\trest\t\n", name("series"))
	for _, s := range rep.Results {
		if len(s.ServerHandlerUS) == 0 {
			continue
		}
		rest := "-" // only when every call had Server-Timing, so that the slices align
		if len(s.ServerHandlerUS) == len(s.LatenciesUS) && len(s.ServerStartUS) == len(s.LatenciesUS) {
			r := make([]int64, len(s.LatenciesUS))
			for i := range r {
				r[i] = s.LatenciesUS[i] - s.ServerStartUS[i] - s.ServerHandlerUS[i]
			}
			rest = ms(Percentile(r, 50))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", name(s.Series), s.Concurrency, ms(s.P50US),
			ms(Percentile(s.ServerStartUS, 50)), ms(Percentile(s.ServerHandlerUS, 50)), rest)
	}
	tw.Flush()

	for _, s := range rep.Results {
		if s.Failures == 0 && s.WarmupFailures == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s c=%d: %d of %d measured calls failed (%d in warm-up):\n", s.Series, s.Concurrency, s.Failures, s.N+s.Failures, s.WarmupFailures)
		for _, e := range s.Errors {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
}

// ms formats microseconds as milliseconds.
func ms(us int64) string { return strconv.FormatFloat(float64(us)/1000, 'f', 3, 64) }

func ratio(r float64) string {
	if r == 0 {
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 2, 64) + "x"
}
