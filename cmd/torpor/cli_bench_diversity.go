package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchDiversityCmd builds `torpor bench diversity`: throughput as the
// calls spread over more and more functions (SEUSS Fig. 6-7).
func newBenchDiversityCmd(g *globals) *cobra.Command {
	var opts bench.DiversityOptions
	cmd := &cobra.Command{
		Use:   "diversity",
		Short: "Throughput and latency of calls spread over M functions vs fork-per-call",
		Long: `Diversity deploys NOP functions bench-v-0001 ... and, for M = --min-functions,
doubling up to --max-functions, makes --calls calls from --concurrency
closed-loop clients, each call to one of the M functions drawn uniformly at
random (--seed). Every M starts with no instance or template of any function
cached (DELETE .../instances on each), as in SEUSS's runs. It reports
throughput, p50/p99 and the mix of start paths per M; the baseline is the
same load against the fork-per-call server (a fresh "python3 -I -S" per
call, independent of M: measured once, --baseline-calls calls). It stops
doubling when available memory falls below the reclaimer's low watermark or
a deploy is refused. It writes results.json, results.csv and throughput.png
to --out, deletes the functions, and exits 1 if any measured call failed.`,
		Example: `  torpor bench diversity
  torpor bench diversity --calls 10000 --max-functions 4096`,
		Args: args(),
	}
	fill := platformFlags(cmd, g, "diversity", &opts.PlatformOptions)
	var seed int64
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case opts.Calls < 1 || opts.BaselineCalls < 1:
			return usageError{fmt.Errorf("invalid --calls %d / --baseline-calls %d: use 1 or more", opts.Calls, opts.BaselineCalls)}
		case opts.Concurrency < 1 || opts.Concurrency > 1000:
			return usageError{fmt.Errorf("invalid --concurrency %d: use 1-1000", opts.Concurrency)}
		case opts.MinFunctions < 1 || opts.MaxFunctions < opts.MinFunctions || opts.MaxFunctions > 9999:
			return usageError{fmt.Errorf("invalid --min-functions %d / --max-functions %d: use 1 <= min <= max <= 9999", opts.MinFunctions, opts.MaxFunctions)}
		case seed < 1:
			return usageError{fmt.Errorf("invalid --seed %d: use 1 or more", seed)}
		}
		opts.Seed = uint64(seed)
		fill()
		rep, err := bench.Diversity(cmd.Context(), opts, cmd.OutOrStdout())
		return benchDone(rep, err, opts.OutDir)
	}
	f := cmd.Flags()
	f.IntVar(&opts.Calls, "calls", bench.DefaultDiversityCalls, "measured calls per number of functions")
	f.IntVar(&opts.Concurrency, "concurrency", bench.DefaultDiversityConcurrency, "closed-loop clients")
	f.IntVar(&opts.MinFunctions, "min-functions", bench.DefaultDiversityMinFunctions, "first number of functions")
	f.IntVar(&opts.MaxFunctions, "max-functions", bench.DefaultDiversityMaxFunctions, "largest number of functions (doubling from --min-functions)")
	f.IntVar(&opts.BaselineCalls, "baseline-calls", bench.DefaultDiversityBaselineCalls, "calls to the fork-per-call baseline")
	f.Int64Var(&seed, "seed", 1, "seed of the random choice of function per call")
	return cmd
}
