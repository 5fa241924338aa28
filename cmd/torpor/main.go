// Command torpor is torpor's one binary. With a server verb (up, gateway,
// worker) it runs a role of the platform; with any other verb it is the
// command-line client of the HTTP API. This package holds flags and
// subcommands only: servers are wired in internal/app, the API is spoken
// by internal/client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/sandbox"
)

func main() {
	// The sandbox init re-executes this binary; it must run before anything
	// else (signal handlers, flags, goroutines), so this stays the first line.
	if sandbox.IsInit() {
		sandbox.InitMain()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, newRootCmd(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes of the torpor command.
const (
	exitOK    = 0
	exitError = 1 // the request failed, or the function raised
	exitUsage = 2 // bad flags or arguments
)

// newRootCmd builds the torpor command tree: the client commands defined in
// the cli_*.go files and the server commands of addServerCommands.
func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "torpor",
		Short: "torpor runs functions from process snapshots",
		Long: `torpor is a serverless platform in which process snapshots are the primitive.

Start everything on this machine with "torpor up", then deploy and call
functions with the client commands below, which talk to the gateway at
--endpoint with the API token of --token, TORPOR_TOKEN or, on the server's
machine, $TORPOR_HOME/api-token.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.endpoint, "endpoint", endpointDefault(),
		"URL of the torpor gateway (env TORPOR_ENDPOINT)")
	root.PersistentFlags().StringVar(&g.token, "token", "",
		"API token of the gateway (env TORPOR_TOKEN; default: the contents of $TORPOR_HOME/api-token, which the server writes)")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w\nRun '%s --help' for usage.", err, cmd.CommandPath())}
	})
	root.AddGroup(
		&cobra.Group{ID: groupFunctions, Title: "Functions:"},
		&cobra.Group{ID: groupCalls, Title: "Calls:"},
		&cobra.Group{ID: groupSnapshots, Title: "Snapshots:"},
		&cobra.Group{ID: groupWorkers, Title: "Workers:"},
	)
	root.AddCommand(
		newDeployCmd(g),
		newLsCmd(g),
		newRmCmd(g),
		newInvokeCmd(g),
		newCallsCmd(g),
		newCallCmd(g),
		newLogsCmd(g),
		newSnapshotCmd(g),
		newWorkersCmd(g),
		newDoctorCmd(),
	)
	root.AddCommand(newBenchCmd(g))
	addServerCommands(root)
	return root
}

// run executes root with args and returns the process exit code. Errors are
// printed here, once, as "torpor: <message>".
func run(ctx context.Context, root *cobra.Command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ex exitCodeError
	if errors.As(err, &ex) {
		return ex.code // the command has printed what the user needs
	}
	fmt.Fprintln(stderr, "torpor: "+describe(err))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}
