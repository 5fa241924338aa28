package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/app"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot/criu"
)

// newDoctorCmd checks this machine the way a worker will use it, and says
// what to fix.
func newDoctorCmd() *cobra.Command {
	cfg := config.Default()
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this machine for what a worker needs (root, Python, CRIU, snapshot store)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if failed := doctor(cmd.Context(), cfg, cmd.OutOrStdout()); failed > 0 {
				return exitCodeError{code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Home, "home", cfg.Home, "state directory (env TORPOR_HOME)")
	f.StringVar(&cfg.Python, "python", cfg.Python, "Python interpreter (env TORPOR_PYTHON)")
	f.StringVar(&cfg.CRIU, "criu", cfg.CRIU, "criu binary (env TORPOR_CRIU)")
	f.StringVar(&cfg.SnapshotStore, "snapshot-store", cfg.SnapshotStore, "snapshot store (env TORPOR_SNAPSHOT_STORE)")
	f.StringVar(&cfg.ClusterKeyFile, "cluster-key-file", cfg.ClusterKeyFile, "snapshot signing key (env TORPOR_CLUSTER_KEY_FILE)")
	return cmd
}

// doctor prints one line per check and returns how many failed.
func doctor(ctx context.Context, cfg config.Config, out io.Writer) int {
	failed := 0
	report := func(ok bool, what, detail string) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			failed++
		}
		fmt.Fprintf(out, "%s  %-16s %s\n", mark, what, detail)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	fmt.Fprintf(out, "      %-16s %s %s\n", "kernel", unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Machine[:]))
	report(os.Geteuid() == 0, "root", map[bool]string{true: "running as root", false: "a worker must run as root: use sudo"}[os.Geteuid() == 0])

	// Sandboxes live in user namespaces (docs/sandbox.md).
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil {
		n := strings.TrimSpace(string(b))
		report(n != "0", "user namespaces", "max_user_namespaces = "+n+map[bool]string{true: "", false: ": sandboxes need them (sysctl user.max_user_namespaces=10000)"}[n != "0"])
	}

	if exe, err := os.Executable(); err == nil {
		if p := sandbox.FindInit(ctx, exe); p != "" {
			report(true, "sandbox init", p)
		} else {
			fmt.Fprintf(out, "%-4s  %-16s %s\n", "warn", "sandbox init", "no torpor-init of this build beside "+exe+": the worker re-executes itself (~8 ms slower per start and restore; scripts/install.sh installs it)")
		}
	}

	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	py, err := config.ResolvePython(pctx, cfg.Python)
	cancel()
	if err != nil {
		report(false, "python", err.Error())
	} else {
		report(true, "python", py.Path+" (prefix "+py.Prefix+")")
	}

	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	engine, err := criu.New(cctx, cfg.CRIU, "")
	if err != nil {
		report(false, "criu", err.Error())
	} else {
		info, _ := engine.Info(cctx)
		report(true, "criu", fmt.Sprintf("%s %s (%s)", info.Name, info.Version, info.Source))
		if info.Check != nil {
			report(false, "criu check", strings.ReplaceAll(info.Check.Error(), "\n", "\n                        "))
		} else {
			report(true, "criu check", "passes")
		}
	}

	store, keys, err := app.OpenSnapshotStore(ctx, cfg)
	if err != nil {
		report(false, "snapshot store", err.Error())
		return failed
	}
	probe := ".doctor/probe"
	data := []byte("torpor doctor " + time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := store.Put(ctx, probe, bytes.NewReader(data), int64(len(data))); err != nil {
		report(false, "snapshot store", cfg.SnapshotStoreSpec()+": cannot write: "+err.Error())
	} else {
		_ = store.Delete(ctx, probe)
		report(true, "snapshot store", cfg.SnapshotStoreSpec()+" (writable)")
	}
	report(true, "cluster key", cfg.ClusterKeyPath()+" (key id "+keys.ID()+"; every node needs the same file)")
	return failed
}
