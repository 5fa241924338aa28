package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchStartsCmd builds `torpor bench starts`: the latency of each start
// path (hot, warm, cold) against a fork-per-call server.
func newBenchStartsCmd(g *globals) *cobra.Command {
	var opts bench.StartsOptions
	cmd := &cobra.Command{
		Use:   "starts",
		Short: "Hot, warm and cold start latency of a NOP Python function vs fork-per-call",
		Long: `Starts deploys bench-starts (def handler(e, c): return {}) and measures each
start path through the REST API, one call at a time:

  hot       --calls calls back to back: each finds the idle instance the last left
  warm      --samples calls, each after DELETE .../instances?keep_templates=true:
            the instance is forked from the function's template
  cold      --samples calls, each after DELETE .../instances (templates too): a
            function template is forked from the runtime template, imports the
            code, and forks the instance
  cold-new  --fresh calls, each to a function deployed just before (and its
            instances and templates dropped), deleted after

The baseline is a server the benchmark starts on 127.0.0.1 that runs a fresh
"python3 -I -S -c <handler>" per request, like a fork-per-request watchdog;
--samples calls. It prints p50/p99 with ratios to the baseline, the targets
(hot <= 0.35 ms, warm <= 2 ms, cold <= 5 ms, p50) and the Server-Timing split,
and writes results.json, results.csv and latency.png to --out. It exits 1 if
any measured call failed.`,
		Example: `  torpor bench starts
  torpor bench starts --calls 10000 --samples 1000 --fresh 200 --out /tmp/starts`,
		Args: args(),
	}
	fill := platformFlags(cmd, g, "starts", &opts.PlatformOptions)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if opts.Calls < 1 || opts.Samples < 1 {
			return usageError{fmt.Errorf("invalid --calls %d / --samples %d: use 1 or more", opts.Calls, opts.Samples)}
		}
		if opts.Warmup < 0 || opts.Fresh < 0 {
			return usageError{fmt.Errorf("invalid --warmup %d / --fresh %d: use 0 or more", opts.Warmup, opts.Fresh)}
		}
		if opts.Warmup == 0 {
			opts.Warmup = -1 // StartsOptions: 0 means the default, -1 none
		}
		if opts.Fresh == 0 {
			opts.Fresh = -1
		}
		fill()
		rep, err := bench.Starts(cmd.Context(), opts, cmd.OutOrStdout())
		return benchDone(rep, err, opts.OutDir)
	}
	f := cmd.Flags()
	f.IntVar(&opts.Calls, "calls", bench.DefaultStartsCalls, "measured hot calls")
	f.IntVar(&opts.Warmup, "warmup", bench.DefaultStartsWarmup, "unmeasured hot calls made first")
	f.IntVar(&opts.Samples, "samples", bench.DefaultStartsSamples, "measured warm, cold and baseline calls (each prepared unmeasured)")
	f.IntVar(&opts.Fresh, "fresh", bench.DefaultStartsFresh, "cold calls to freshly deployed functions; 0: none")
	f.StringVar(&opts.Function, "function", bench.DefaultStartsFunction, "name to deploy the NOP function under")
	return cmd
}
