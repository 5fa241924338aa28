package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/function"
)

const groupSnapshots = "snapshots"

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Short:   "List, inspect, delete and take process snapshots of function instances",
		GroupID: groupSnapshots,
	}
	cmd.AddCommand(newSnapshotLsCmd(g), newSnapshotInspectCmd(g), newSnapshotRmCmd(g), newSnapshotCreateCmd(g),
		newSnapshotExportCmd(g), newSnapshotImportCmd(g), newSnapshotGCCmd(g))
	return cmd
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func newSnapshotLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List stored snapshots, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if len(list) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no snapshots yet: take one with `torpor snapshot create FUNCTION`")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tFUNCTION\tVERSION\tCREATED\tSTORED\tRAW\tRUNTIME\tIN USE")
			for _, s := range list {
				if s.Error != "" {
					fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\tunusable: %s\n", shortID(s.ID), s.Error)
					continue
				}
				created := s.CreatedAt
				if t, err := time.Parse(time.RFC3339, s.CreatedAt); err == nil {
					created = t.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", shortID(s.ID), s.Function, s.FunctionVersion, created,
					mib(s.StoredBytes), mib(s.RawBytes), s.Runtime, strings.Join(s.InUse, ","))
			}
			return tw.Flush()
		},
	}
}

func newSnapshotInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID",
		Short: "Print a snapshot's manifest as JSON (ID may be a unique prefix)",
		Args:  args("ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(s)
		},
	}
}

func newSnapshotRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID...",
		Short: "Delete snapshots (versions starting from one start cold again)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, ref := range a {
				if err := c.DeleteSnapshot(cmd.Context(), ref); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", ref)
			}
			return nil
		},
	}
}

func newSnapshotCreateCmd(g *globals) *cobra.Command {
	var req api.SnapshotCreate
	cmd := &cobra.Command{
		Use:   "create FUNCTION|INSTANCE|CALL",
		Short: "Checkpoint an idle instance into the snapshot store",
		Long: `Checkpoint an instance into the snapshot store:

  FUNCTION  any idle instance of the function (or a new one)
  INSTANCE  the idle instance i-… (name its function with --function; with
            several workers, name its worker with --worker)
  CALL      the instance that served the call (a call id), on the worker
            that ran it, once the call is over

The agent runs the GC and trims its allocator first; the image is streamed,
compressed and signed. With --use, new instances of that version start from
the snapshot on every worker (X-Torpor-Start: restore).`,
		Args: args("FUNCTION|INSTANCE|CALL"),
		RunE: func(cmd *cobra.Command, a []string) error {
			switch {
			case strings.HasPrefix(a[0], "i-"):
				if req.Function == "" {
					return usageError{fmt.Errorf("snapshot of instance %s: name its function with --function", a[0])}
				}
				req.Instance = a[0]
			case function.ValidateCallID(a[0]) == nil && strings.Count(a[0], "-") == 4:
				req.Call = a[0]
			default:
				req.Function = a[0]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			start := time.Now()
			fmt.Fprintf(cmd.ErrOrStderr(), "checkpointing %s …\n", a[0])
			res, err := c.CreateSnapshot(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", res.ID)
			fmt.Fprintf(cmd.ErrOrStderr(), "%s v%d, instance %s on %s: rss %s → %s after GC, image %s → %s stored; dump %v, total %v%s\n",
				res.Function, res.Version, res.Instance, res.Worker, mib(res.RSSBefore), mib(res.RSSAfter), mib(res.RawBytes), mib(res.StoredBytes),
				time.Duration(res.DumpNanos).Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
				map[bool]string{true: "; new instances start from it", false: ""}[res.Used])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Function, "function", "", "the function of INSTANCE")
	f.StringVar(&req.Worker, "worker", "", "the worker holding INSTANCE")
	f.IntVar(&req.Version, "version", 0, "function version (default: latest)")
	f.BoolVar(&req.LeaveRunning, "leave-running", false, "keep the instance serving after the dump")
	f.BoolVar(&req.NoGC, "no-gc", false, "skip the runtime's GC and allocator trim before the dump")
	f.BoolVar(&req.Use, "use", false, "start new instances of this version from the snapshot")
	return cmd
}

func newSnapshotExportCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "export ID FILE",
		Short: "Download a snapshot as one file, for `torpor snapshot import` on another cluster or store",
		Args:  args("ID", "FILE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			tmp := a[1] + ".part"
			f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			bar := newProgressBar(cmd.ErrOrStderr(), "downloading")
			id, err := c.ExportSnapshot(cmd.Context(), a[0], f, bar.update)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				_ = os.Remove(tmp)
				return err
			}
			if err := os.Rename(tmp, a[1]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s → %s\n", id, a[1])
			return nil
		},
	}
}

func newSnapshotImportCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE",
		Short: "Upload a snapshot made by `torpor snapshot export` (it must be signed with this cluster's key)",
		Args:  args("FILE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			f, err := os.Open(a[0])
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			bar := newProgressBar(cmd.ErrOrStderr(), "uploading")
			snap, err := c.ImportSnapshot(cmd.Context(), f, st.Size(), bar.update)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s (%s v%d)\n", snap.ID, snap.Function, snap.FunctionVersion)
			return nil
		},
	}
}

func newSnapshotGCCmd(g *globals) *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove snapshot data no snapshot refers to (left by uploads that died half way)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			removed, err := c.GCSnapshots(cmd.Context(), olderThan)
			if err != nil {
				return err
			}
			for _, k := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), k)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "removed %d unreferenced data objects\n", len(removed))
			return nil
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", time.Hour, "only data older than this (uploads in progress have no manifest yet either)")
	return cmd
}
