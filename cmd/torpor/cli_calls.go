package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/function"
)

func newCallsCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:     "calls NAME",
		Short:   "List recent calls of a function",
		GroupID: groupCalls,
		Args:    args("NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if limit < 1 || limit > api.MaxCallsLimit {
				return usageError{fmt.Errorf("invalid --limit %d: use 1-%d", limit, api.MaxCallsLimit)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			calls, err := c.Calls(cmd.Context(), a[0], limit)
			if err != nil {
				return err
			}
			if len(calls) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "no calls of %s yet\n", a[0])
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tVERSION\tMODE\tSTATUS\tSTART\tHOPS\tCREATED\tDURATION\tERROR")
			for _, c := range calls {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Version, c.Mode, c.Status, callStart(c), callHops(c),
					c.CreatedAt.Local().Format(time.DateTime), callDuration(c), callError(c))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", api.DefaultCallsLimit, fmt.Sprintf("how many calls to list (1-%d)", api.MaxCallsLimit))
	return cmd
}

func newCallCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "call ID",
		Short:   "Print the record of one call as JSON",
		GroupID: groupCalls,
		Args:    args("ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			call, err := c.Call(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			b, err := json.MarshalIndent(call, "", "  ")
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
}

// callStart is how the last attempt's instance was obtained.
func callStart(c function.Call) string {
	if n := len(c.Attempts); n > 0 && c.Attempts[n-1].Start != "" {
		return c.Attempts[n-1].Start
	}
	return "-"
}

// callHops is how many workers the call ran on, and why it left the
// others: "2 (moved)" for a call checkpointed once and resumed, "2 (lost)"
// for one run again after its worker went away (`torpor call ID` shows
// each hop). Attempts that failed before the call ran ("retry: …", a
// restore that failed) are not hops.
func callHops(c function.Call) string {
	moved, lost, retries := 0, 0, 0
	for _, a := range c.Attempts {
		switch {
		case a.Outcome == function.OutcomeCheckpointed:
			moved++
		case a.Outcome == function.OutcomeLost:
			lost++
		case strings.HasPrefix(a.Outcome, "retry:"):
			retries++
		}
	}
	n := max(len(c.Attempts)-retries, 1)
	switch {
	case moved > 0 && lost > 0:
		return fmt.Sprintf("%d (%d moved, %d lost)", n, moved, lost)
	case moved > 0:
		return fmt.Sprintf("%d (moved)", n)
	case lost > 0:
		return fmt.Sprintf("%d (lost)", n)
	}
	return strconv.Itoa(n)
}

func callDuration(c function.Call) string {
	if c.DurationMS == 0 {
		return "-"
	}
	return (time.Duration(c.DurationMS * float64(time.Millisecond))).Round(10 * time.Microsecond).String()
}

func callError(c function.Call) string {
	if c.Error == nil {
		return ""
	}
	return c.Error.ErrorType
}
