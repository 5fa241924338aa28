package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

func newDeployCmd(g *globals) *cobra.Command {
	var (
		spec function.Spec
		code string
		env  []string
	)
	cmd := &cobra.Command{
		Use:     "deploy NAME --handler MODULE.FUNCTION --code DIR|ZIP",
		Short:   "Deploy a new version of a function",
		GroupID: groupFunctions,
		Long: `Deploy uploads the code in DIR (zipped on the fly) or in an existing .zip file
as a new version of function NAME. The gateway imports the handler in a sandbox
before accepting it, so a missing handler or a syntax error fails the deploy.`,
		Example: `  torpor deploy hello --handler app.handler --code ./hello
  torpor deploy resize --handler main.handler --code resize.zip --memory 512 --timeout 30 --env BUCKET=images
  torpor deploy train --handler job.run --code ./train --timeout 60 --max-duration 3600`,
		Args: args("NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			spec.Name = a[0]
			if spec.Handler == "" || code == "" {
				return usageError{fmt.Errorf("deploy needs --handler and --code\nUsage: %s", cmd.UseLine())}
			}
			var err error
			if spec.Env, err = parseEnv(env); err != nil {
				return err
			}
			if err := spec.Normalize(); err != nil {
				return err
			}
			zip, err := loadCode(code)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.Deploy(cmd.Context(), spec, zip)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deployed %s version %d (%s %s, %d MB, %s; code %s, sha256 %.12s)\n",
				v.Name, v.Version, v.Runtime, v.Handler, v.MemoryMB, timeLimits(v.Spec), byteSize(v.CodeSize), v.CodeDigest)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.Runtime, "runtime", "python3", "runtime of the function")
	f.StringVar(&spec.Handler, "handler", "", "handler as MODULE.FUNCTION, e.g. app.handler (required)")
	f.StringVar(&code, "code", "", "directory holding the code, or a .zip of it (required)")
	f.IntVar(&spec.MemoryMB, "memory", function.DefaultMemoryMB, fmt.Sprintf("memory limit in MB (%d-%d)", function.MinMemoryMB, function.MaxMemoryMB))
	f.Float64Var(&spec.TimeoutSec, "timeout", function.DefaultTimeout.Seconds(), fmt.Sprintf("time limit of a call in seconds (0.1-%g)", function.MaxTimeout.Seconds()))
	f.Float64Var(&spec.MaxDurationSec, "max-duration", 0, fmt.Sprintf("total run time of a call across slices, in seconds (0: the timeout; at most %g); "+
		"when longer than --timeout, a call is checkpointed when a slice ends and resumed (R-Check time limits)", function.MaxMaxDuration.Seconds()))
	f.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	f.IntVar(&spec.Concurrency, "concurrency", 0, fmt.Sprintf("maximum parallel instances, 0 for no limit (max %d)", function.MaxConcurrency))
	return cmd
}

// timeLimits renders a spec's timeout and, when calls run in slices, their
// total run time.
func timeLimits(s function.Spec) string {
	if s.Sliced() {
		return fmt.Sprintf("%gs (max %gs)", s.TimeoutSec, s.MaxDurationSec)
	}
	return fmt.Sprintf("%gs", s.TimeoutSec)
}

// parseEnv turns K=V flags into a map.
func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("invalid --env %q: use --env NAME=VALUE", kv)}
		}
		env[k] = v
	}
	return env, nil
}

// loadCode returns the code zip for path: a directory is zipped, a file is
// taken as a zip and validated here, so that a bad package fails before
// the upload.
func loadCode(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--code %s: %w", path, err)
	}
	if fi.IsDir() {
		return codezip.ZipDir(path)
	}
	if fi.Size() > function.MaxCodeZipBytes {
		return nil, errdefs.TooLarge(fmt.Sprintf("--code %s is %s: the code zip limit is %d MB", path, byteSize(fi.Size()), function.MaxCodeZipBytes>>20))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--code %s: %w", path, err)
	}
	defer f.Close()
	zip, err := io.ReadAll(io.LimitReader(f, function.MaxCodeZipBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--code %s: %w", path, err)
	}
	if _, err := codezip.Validate(zip); err != nil {
		return nil, fmt.Errorf("--code %s: %w", path, err)
	}
	return zip, nil
}

// byteSize renders n bytes for humans.
func byteSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
