package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/api"
)

const groupWorkers = "workers"

func newWorkersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List the workers and what each keeps warm",
		Long: `Workers lists every live worker: the memory limits of its instances against
its memory budget, the calls it runs, and what it keeps of which functions
(idle instances, templates). Calls go to a worker that holds an idle
instance or a template of the function when there is one.`,
		GroupID: groupWorkers,
		Args:    args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Workers(cmd.Context())
			if err != nil {
				return err
			}
			if len(list) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no worker is running: start one with `torpor up` or `torpor worker`")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRESERVED/BUDGET\tRUNNING\tFUNCTIONS\tIDLE\tTEMPLATES\tUPDATED")
			for _, w := range list {
				fns := map[string]bool{}
				idle, templates := 0, 0
				for _, h := range w.Holdings {
					fns[h.Function] = true
					idle += h.Idle
					if h.Template {
						templates++
					}
				}
				id := w.ID
				if w.Draining {
					id += " (draining)"
				}
				fmt.Fprintf(tw, "%s\t%d/%d MB\t%d\t%d\t%d\t%d\t%s\n", id, w.ReservedMB, w.MemoryBudgetMB, w.Running,
					len(fns), idle, templates, ago(w.UpdatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(newWorkersInspectCmd(g), newWorkersDropCmd(g), newWorkersEvictCmd(g))
	return cmd
}

// ago says how long ago the RFC 3339 time ts was.
func ago(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	return time.Since(t).Round(100*time.Millisecond).String() + " ago"
}

// mb formats a byte count in MB with one decimal.
func mb(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

func newWorkersInspectCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a worker's templates and instances with the memory of each process",
		Long: `Inspect asks worker ID for every template and instance process it keeps and
their memory from /proc/PID/smaps_rollup: RSS (resident), PSS (shared pages
divided among the processes sharing them: what each really costs) and USS
(its private pages), in MB.`,
		Args: args("ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Worker(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "worker %s: %d of %d MB reserved, %d call(s) running; host memory available %d MB (reclaim below %d MB, up to %d MB)\n",
				info.ID, info.ReservedMB, info.MemoryBudgetMB, info.Running, info.MemAvailableMB, info.LowWatermarkMB, info.HighWatermarkMB)
			procs := append(append([]api.ProcessInfo{}, info.Templates...), info.Instances...)
			if len(procs) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no templates or instances")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tFUNCTION\tVERSION\tID\tPID\tSTATE\tSTART\tRSS MB\tPSS MB\tUSS MB")
			var rss, pss, uss int64
			for _, p := range procs {
				fn, ver := dash(p.Function), "-"
				if p.Version > 0 {
					ver = fmt.Sprint(p.Version)
				}
				if p.Runtime != "" && p.Function == "" {
					fn = p.Runtime
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Kind, fn, ver, p.ID, p.Pid, dash(p.State),
					dash(p.Start), mb(p.RSS), mb(p.PSS), mb(p.USS))
				rss, pss, uss = rss+p.RSS, pss+p.PSS, uss+p.USS
			}
			fmt.Fprintf(tw, "total\t\t\t\t\t\t\t%s\t%s\t%s\n", mb(rss), mb(pss), mb(uss))
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the worker's answer as JSON")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newWorkersDropCmd(g *globals) *cobra.Command {
	var (
		version int
		keep    bool
	)
	cmd := &cobra.Command{
		Use:   "drop FUNCTION",
		Short: "Stop the idle instances (and templates) of a function on every worker",
		Long: `Drop stops, on every worker, the idle instances of FUNCTION (of every version,
or of --version) and, unless --keep-templates, its function templates. Busy
instances finish their calls. The next call starts warm or cold.`,
		Args: args("FUNCTION"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.DropInstances(cmd.Context(), a[0], version, keep)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stopped %d idle instance(s) and %d template(s) of %s on %d worker(s)\n",
				res.Instances, res.Templates, a[0], res.Workers)
			return nil
		},
	}
	cmd.Flags().IntVar(&version, "version", 0, "only this version (default: every version)")
	cmd.Flags().BoolVar(&keep, "keep-templates", false, "keep the function templates, stop only idle instances")
	return cmd
}

func newWorkersEvictCmd(g *globals) *cobra.Command {
	var (
		grace  time.Duration
		reason string
	)
	cmd := &cobra.Command{
		Use:   "evict ID",
		Short: "Evict a worker: move its running calls to other workers, then stop it",
		Long: `Evict asks worker ID to stop taking calls and to move its running calls away
within the grace period: a call predicted to finish within the grace is let
finish, the others are checkpointed and resumed on another worker. Then the
worker exits. It answers at once, before anything moves; the worker's log
and the calls' records (torpor calls) tell how the moves went.`,
		Example: `  torpor workers evict w1
  torpor workers evict w1 --grace 2m --reason "kernel upgrade"`,
		Args: args("ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if grace < 0 {
				return usageError{fmt.Errorf("invalid --grace %s: use a duration such as 30s or 2m, or 0 for the worker's --eviction-grace", grace)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// Round up: a grace under a millisecond must not become 0, the
			// worker's default.
			req := api.EvictRequest{GraceMS: int64((grace + time.Millisecond - 1) / time.Millisecond), Reason: reason}
			rep, err := c.Evict(cmd.Context(), a[0], req)
			if err != nil {
				return err
			}
			calls := "calls"
			if rep.Running == 1 {
				calls = "call"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "evicting worker %s: %d %s running, grace %s\n", rep.Worker, rep.Running, calls,
				time.Duration(rep.GraceMS)*time.Millisecond)
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 0, "time to move the running calls away, e.g. 30s (default: the worker's --eviction-grace)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the worker's log (at most 200 characters)")
	return cmd
}
