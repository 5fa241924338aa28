package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/config"
)

// defaultEndpoint is where "torpor up" serves the API.
const defaultEndpoint = "http://127.0.0.1:8080"

// Command groups in the help text.
const (
	groupFunctions = "functions"
	groupCalls     = "calls"
)

// globals are the persistent flags shared by the client commands.
type globals struct {
	endpoint string
	token    string // --token; see apiToken
}

// client returns an API client of the gateway at --endpoint that sends the
// API token.
func (g *globals) client() (*client.Client, error) {
	return client.New(g.endpoint, client.WithToken(g.apiToken()))
}

// apiToken is the token the client commands send: --token, else
// TORPOR_TOKEN, else the file a server on this machine wrote, read when
// the command runs (never a flag default, which --help would print).
func (g *globals) apiToken() string {
	return client.ResolveToken(g.token, os.Getenv("TORPOR_TOKEN"), defaultTokenFile())
}

// defaultTokenFile is where a server with the default home keeps its
// API token: $TORPOR_HOME/api-token, by default ~/.torpor/api-token.
func defaultTokenFile() string {
	return filepath.Join(config.DefaultHome(), config.APITokenFileName)
}

func endpointDefault() string {
	if ep := os.Getenv("TORPOR_ENDPOINT"); ep != "" {
		return ep
	}
	return defaultEndpoint
}

// describe renders err for the terminal: the server's own message for API
// errors, and a hint when the gateway cannot be reached at all.
func describe(err error) string {
	var ce *client.ConnError
	if errors.As(err, &ce) {
		cause := ce.Err
		var ue *url.Error
		if errors.As(cause, &ue) {
			cause = ue.Err // drop the repeated method and URL
		}
		return fmt.Sprintf("cannot reach torpor at %s: is `torpor up` running? (%v)", ce.Endpoint, cause)
	}
	var ae *client.AuthError
	if errors.As(err, &ae) {
		const what = "set TORPOR_TOKEN or --token (the server's token is in $TORPOR_HOME/api-token)"
		if !ae.TokenSent {
			return fmt.Sprintf("torpor at %s wants an API token and none was found (--token, TORPOR_TOKEN, %s): %s",
				ae.Endpoint, defaultTokenFile(), what)
		}
		return fmt.Sprintf("torpor at %s refused the API token: %s", ae.Endpoint, what)
	}
	return err.Error()
}

// usageError marks a mistake in the command line (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCodeError ends the command with code after the command itself has
// printed what the user needs (e.g. a function's error JSON).
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// args checks the number of positional arguments and names the missing
// ones, e.g. args("NAME") or args("NAME", "[JSON]").
func args(names ...string) cobra.PositionalArgs {
	required := 0
	for _, n := range names {
		if !strings.HasPrefix(n, "[") {
			required++
		}
	}
	return func(cmd *cobra.Command, got []string) error {
		switch {
		case len(got) < required:
			return usageError{fmt.Errorf("%s needs %s\nUsage: %s", cmd.CommandPath(), strings.Join(names[len(got):required], " "), cmd.UseLine())}
		case len(got) > len(names):
			return usageError{fmt.Errorf("%s takes at most %d argument(s), got %d: %q\nUsage: %s", cmd.CommandPath(), len(names), len(got), got, cmd.UseLine())}
		}
		return nil
	}
}
