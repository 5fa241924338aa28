package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Short:   "List functions",
		GroupID: groupFunctions,
		Args:    args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			fns, err := c.Functions(cmd.Context())
			if err != nil {
				return err
			}
			if len(fns) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no functions: deploy one with `torpor deploy NAME --handler app.handler --code DIR`")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tRUNTIME\tHANDLER\tMEMORY\tTIMEOUT\tCONCURRENCY\tDEPLOYED")
			for _, v := range fns {
				conc := "-"
				if v.Concurrency > 0 {
					conc = fmt.Sprint(v.Concurrency)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d MB\t%s\t%s\t%s\n", v.Name, v.Version, v.Runtime, v.Handler,
					v.MemoryMB, timeLimits(v.Spec), conc, v.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}
