package main

import (
	"bytes"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/function"
)

func newInvokeCmd(g *globals) *cobra.Command {
	var (
		async   bool
		version int
		verbose bool
	)
	cmd := &cobra.Command{
		Use:     "invoke NAME [JSON|-]",
		Short:   "Call a function and print its result",
		GroupID: groupCalls,
		Long: `Invoke calls function NAME with the JSON event given as an argument, read from
standard input when it is "-", or {} when absent, and prints the result.

When the handler raises, times out or crashes, the error JSON goes to standard
error and the exit status is 1. With --async the call is queued and its id
printed; see it later with "torpor call ID".`,
		Example: `  torpor invoke hello '{"name": "world"}'
  echo '{"n": 3}' | torpor invoke fib -
  torpor invoke report --async`,
		Args: args("NAME", "[JSON]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			var event []byte
			if len(a) == 2 {
				event = []byte(a[1])
				if a[1] == "-" {
					var err error
					if event, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), function.MaxPayloadBytes+1)); err != nil {
						return fmt.Errorf("read the event from standard input: %w", err)
					}
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if async {
				call, err := c.InvokeAsync(cmd.Context(), a[0], version, event)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, call.ID)
				return nil
			}
			res, err := c.Invoke(cmd.Context(), a[0], version, event)
			if err != nil {
				return err
			}
			if verbose {
				fmt.Fprintf(errOut, "call %s: version %d, %s start in %v, handler %v\n", res.CallID, res.Version, res.Start, res.StartTime, res.Duration)
			}
			if res.FunctionError != nil {
				errOut.Write(withNewline(res.Payload))
				return exitCodeError{exitError}
			}
			out.Write(withNewline(res.Payload))
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&async, "async", false, "queue the call and print its id instead of waiting")
	f.IntVar(&version, "version", 0, "version to call (default: the latest)")
	f.BoolVarP(&verbose, "verbose", "v", false, "print the call id, version and timings to standard error")
	return cmd
}

func withNewline(b []byte) []byte {
	if bytes.HasSuffix(b, []byte("\n")) {
		return b
	}
	return append(b, '\n')
}
