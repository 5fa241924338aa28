package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/function"
)

// logTimeFormat is RFC 3339 with milliseconds.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func newLogsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:     "logs NAME",
		Short:   "Print a function's log lines",
		GroupID: groupCalls,
		Long: `Logs prints what function NAME wrote, one line each as "TIME [CALL] TEXT",
oldest first. With --follow it keeps printing new lines until interrupted.`,
		Args: args("NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			return c.Logs(cmd.Context(), a[0], follow, func(l function.LogLine) error {
				_, err := fmt.Fprintln(out, formatLogLine(l))
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines as they are written")
	return cmd
}

func formatLogLine(l function.LogLine) string {
	ts := l.Time.Format(logTimeFormat)
	if l.CallID == "" {
		return ts + " " + l.Text
	}
	return ts + " [" + l.CallID + "] " + l.Text
}
