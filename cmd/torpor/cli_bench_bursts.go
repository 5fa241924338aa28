package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchBurstsCmd builds `torpor bench bursts`: bursts of calls to new
// functions over a steady background (SEUSS §8.4).
func newBenchBurstsCmd(g *globals) *cobra.Command {
	var opts bench.BurstsOptions
	cmd := &cobra.Command{
		Use:   "bursts",
		Short: "Bursts of parallel calls to never-seen functions over a steady background vs fork-per-call",
		Long: `Bursts deploys bench-bursts-sleep (a handler that sleeps 50 ms) and calls it
open-loop at --rate calls/s for the whole run (the background). Over it, one
phase of --phase-duration per --intervals: a burst every interval (the first
at half an interval) of --burst parallel calls to a NOP function deployed
--lead before the burst, its deploy's leftovers dropped, so that nothing of
it is cached. Then the baseline phase, --baseline-duration long: the same
background and bursts, at the shortest interval, against the fork-per-call
server (a fresh "python3 -I -S" per call). It reports every burst's failures,
p50/p99/max and completion time, and the background's latency per phase,
with ratios to the baseline, and writes results.json, results.csv and
timeline.png to --out. Any failed call is a failure of the run: it exits 1.
The default run lasts about 4 minutes; --phase-duration 16s makes it one.`,
		Example: `  torpor bench bursts
  torpor bench bursts --phase-duration 16s --intervals 8s,4s --baseline-duration 8s`,
		Args: args(),
	}
	fill := platformFlags(cmd, g, "bursts", &opts.PlatformOptions)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		short := time.Duration(1<<63 - 1)
		for _, iv := range opts.Intervals {
			short = min(short, iv)
			if iv <= 0 || iv > opts.PhaseDuration {
				return usageError{fmt.Errorf("invalid --intervals %s: use intervals > 0 and no longer than --phase-duration %s", iv, opts.PhaseDuration)}
			}
		}
		switch {
		case len(opts.Intervals) == 0:
			return usageError{fmt.Errorf("invalid --intervals: give at least one")}
		case opts.BaselineDuration < short:
			return usageError{fmt.Errorf("invalid --baseline-duration %s: use at least the shortest interval, %s", opts.BaselineDuration, short)}
		case opts.BurstSize < 1 || opts.BurstSize > 1000:
			return usageError{fmt.Errorf("invalid --burst %d: use 1-1000", opts.BurstSize)}
		case opts.Rate <= 0 || opts.Rate > 1000:
			return usageError{fmt.Errorf("invalid --rate %g: use more than 0, at most 1000", opts.Rate)}
		case opts.Lead < 0 || opts.Lead >= short:
			return usageError{fmt.Errorf("invalid --lead %s: use 0 or more, less than the shortest interval", opts.Lead)}
		}
		if opts.Lead == 0 {
			opts.Lead = time.Nanosecond // BurstsOptions: 0 means the default
		}
		fill()
		rep, err := bench.Bursts(cmd.Context(), opts, cmd.OutOrStdout())
		return benchDone(rep, err, opts.OutDir)
	}
	f := cmd.Flags()
	f.DurationVar(&opts.PhaseDuration, "phase-duration", bench.DefaultBurstsPhase, "length of each torpor phase")
	f.DurationSliceVar(&opts.Intervals, "intervals", bench.DefaultBurstsIntervals, "time between bursts, one phase each, comma-separated")
	f.IntVar(&opts.BurstSize, "burst", bench.DefaultBurstsSize, "parallel calls per burst")
	f.Float64Var(&opts.Rate, "rate", bench.DefaultBurstsRate, "background calls per second (open loop)")
	f.DurationVar(&opts.BaselineDuration, "baseline-duration", bench.DefaultBurstsBaselineDuration, "length of the fork-per-call baseline's phase")
	f.DurationVar(&opts.Lead, "lead", bench.DefaultBurstsLead, "deploy each burst's function this long before the burst")
	return cmd
}
