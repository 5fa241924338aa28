package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Short:   "Delete a function and all its versions",
		GroupID: groupFunctions,
		Args:    args("NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Delete(cmd.Context(), a[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", a[0])
			return nil
		},
	}
}
