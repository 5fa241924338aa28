package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchDensityCmd builds `torpor bench density`: how many idle functions
// a worker keeps, and what each costs, against a process per function.
func newBenchDensityCmd(g *globals) *cobra.Command {
	var opts bench.DensityOptions
	cmd := &cobra.Command{
		Use:   "density",
		Short: "Idle functions cached per worker and their memory vs a process per function",
		Long: `Density deploys unique NOP functions (bench-d-0001, bench-d-0002, ...) and
calls each once, reading GET /v1/workers/{id} after each, until the workers'
templates and instances add up to --budget-mb of PSS, the number of cached
functions has not grown for --plateau deployments (the worker reclaims or
refuses), a deploy or call is refused, available memory falls below the
reclaimer's low watermark, or --max functions. It reports the function
templates and idle instances cached and their USS and PSS (median, p90),
against the baseline: one fresh "python3 -I -S" process idling in a NOP loop,
what a process-per-function design pays per function. Target: <= 1 MiB USS per
idle NOP function template. It writes results.json, results.csv,
processes.csv, cached.png and memory.png to --out, and deletes the functions.
It exits 1 if any call failed.`,
		Example: `  torpor bench density
  torpor bench density --budget-mb 8192 --max 2000`,
		Args: args(),
	}
	fill := platformFlags(cmd, g, "density", &opts.PlatformOptions)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if opts.BudgetMB < 1 || opts.Max < 1 || opts.Max > 9999 || opts.Plateau < 1 {
			return usageError{fmt.Errorf("invalid --budget-mb %d / --max %d / --plateau %d: use a budget of 1 or more, --max 1-9999, --plateau 1 or more",
				opts.BudgetMB, opts.Max, opts.Plateau)}
		}
		fill()
		rep, err := bench.Density(cmd.Context(), opts, cmd.OutOrStdout())
		if err != nil {
			return err
		}
		if rep.Failures > 0 {
			return failedCalls(rep.Failures, opts.OutDir)
		}
		return nil
	}
	f := cmd.Flags()
	f.IntVar(&opts.BudgetMB, "budget-mb", bench.DefaultDensityBudgetMB, "stop once the workers' templates and instances reach this PSS (MiB)")
	f.IntVar(&opts.Max, "max", bench.DefaultDensityMax, "most functions to deploy")
	f.IntVar(&opts.Plateau, "plateau", bench.DefaultDensityPlateau, "stop after this many deployments without more functions cached")
	return cmd
}
