package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/app"
	"github.com/torpor-dev/torpor/internal/config"
)

// addServerCommands adds the commands that run torpor's roles.
func addServerCommands(root *cobra.Command) {
	root.AddCommand(
		serverCmd("up", "Run everything on this machine: HTTP gateway, worker and embedded NATS JetStream",
			app.Roles{Gateway: true, Worker: true}),
		serverCmd("gateway", "Run the HTTP API only, against a shared NATS (--nats)",
			app.Roles{Gateway: true}),
		serverCmd("worker", "Run functions on this node, taking calls from a shared NATS (--nats)",
			app.Roles{Worker: true}),
	)
}

func serverCmd(use, short string, roles app.Roles) *cobra.Command {
	cfg := config.Default()
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// main's context ends on SIGINT/SIGTERM: a graceful shutdown.
			return app.Run(cmd.Context(), cfg, roles, newLogger(cfg.LogLevel))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Home, "home", cfg.Home, "state directory (env TORPOR_HOME)")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error (env TORPOR_LOG_LEVEL)")
	f.StringVar(&cfg.NATSURL, "nats", cfg.NATSURL, "external NATS server URL; empty runs one embedded (env TORPOR_NATS)")
	f.StringVar(&cfg.NATSToken, "nats-token", cfg.NATSToken, "NATS auth token (env TORPOR_NATS_TOKEN)")
	f.DurationVar(&cfg.AckWait, "ack-wait", cfg.AckWait, "redeliver an async call when its worker is silent this long")
	f.DurationVar(&cfg.Retention, "retention", cfg.Retention, "how long call records and logs are kept")
	f.StringVar(&cfg.SnapshotStore, "snapshot-store", cfg.SnapshotStore,
		"where snapshots are kept: a directory, or s3://BUCKET[/PREFIX]?endpoint=URL (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); default $TORPOR_HOME/snapshots; every node must use the same (env TORPOR_SNAPSHOT_STORE)")
	f.StringVar(&cfg.ClusterKeyFile, "cluster-key-file", cfg.ClusterKeyFile,
		"key snapshots are signed with, created when missing; every node needs the same (default $TORPOR_HOME/cluster-key; env TORPOR_CLUSTER_KEY_FILE)")
	if roles.Gateway {
		f.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API address (env TORPOR_LISTEN)")
		f.StringVar((*string)(&cfg.Auth), "auth", string(cfg.Auth),
			"token: every route but /healthz needs the API token; none: no authentication, for tests and trusted networks only (env TORPOR_AUTH)")
		f.StringVar(&cfg.APITokenFile, "api-token-file", cfg.APITokenFile,
			"file holding the API token, created with a random one when missing (default $TORPOR_HOME/api-token; env TORPOR_API_TOKEN_FILE)")
	}
	if roles.Gateway {
		f.StringVar(&cfg.NATSListen, "nats-listen", cfg.NATSListen, "let other nodes join the embedded NATS on this address (env TORPOR_NATS_LISTEN)")
	}
	if roles.Worker {
		f.StringVar(&cfg.WorkerID, "worker-id", cfg.WorkerID, "this worker's id in call records (env TORPOR_WORKER_ID)")
		f.StringVar(&cfg.Python, "python", cfg.Python, "Python interpreter; shims are resolved to the real binary (env TORPOR_PYTHON)")
		f.DurationVar(&cfg.IdleTTL, "idle-ttl", cfg.IdleTTL, "stop an idle instance after this long")
		f.IntVar(&cfg.MaxIdle, "max-idle", cfg.MaxIdle, "most idle instances kept on this worker")
		f.IntVar(&cfg.AsyncSlots, "async-slots", cfg.AsyncSlots, "async calls run in parallel (0 = 4 per CPU)")
		f.IntVar(&cfg.PidsLimit, "pids-limit", cfg.PidsLimit, "processes per instance")
		f.IntVar(&cfg.TmpMB, "tmp-mb", cfg.TmpMB, "size of each instance's /tmp in MB")
		f.IntVar(&cfg.MemoryBudgetMB, "memory-budget", cfg.MemoryBudgetMB,
			"MB of memory limits this worker's live instances may add up to (0 = 3/4 of the machine)")
		f.BoolVar(&cfg.Templates, "templates", cfg.Templates,
			"start instances by forking function templates (SEUSS); false: every instance starts on its own")
		f.DurationVar(&cfg.TemplateTTL, "template-ttl", cfg.TemplateTTL, "stop a function template unused this long")
		f.IntVar(&cfg.ReclaimLowMB, "reclaim-low-mb", cfg.ReclaimLowMB,
			"below this much available host memory, stop idle instances and unused templates (0 = 5% of the machine)")
		f.IntVar(&cfg.ReclaimHighMB, "reclaim-high-mb", cfg.ReclaimHighMB,
			"... until this much is available again (0 = 10% of the machine)")
		f.IntVar(&cfg.SandboxMemoryMB, "sandbox-memory-mb", cfg.SandboxMemoryMB,
			"cap on the memory of all of this worker's sandboxes together, in MB (0 = none)")
		f.BoolVar(&cfg.KeepCgroupOptions, "keep-cgroup-options", cfg.KeepCgroupOptions,
			"leave the host's cgroup2 mount options alone (by default the worker sets favordynmods, which makes moving processes between cgroups ~100x faster)")
		f.StringVar(&cfg.CRIU, "criu", cfg.CRIU, "criu binary for snapshots; default: the one scripts/install-criu.sh set up (env TORPOR_CRIU)")
		f.StringVar(&cfg.SnapshotCompression, "snapshot-compression", cfg.SnapshotCompression, "zstd, lz4 or none")
		f.StringVar(&cfg.SandboxNetwork, "sandbox-network", cfg.SandboxNetwork,
			"none: each instance has its own network namespace with only loopback; host: share the host's (trusted tenants only)")
		f.DurationVar(&cfg.EvictionGrace, "eviction-grace", cfg.EvictionGrace,
			"on SIGTERM, an evict request or a cloud notice without a deadline: how long the worker has to move its running calls to other workers before it exits")
		f.StringVar(&cfg.EvictionNotice, "eviction-notice", cfg.EvictionNotice,
			"poll this cloud's metadata service for spot/preemption notices: aws, gcp, azure or none (env TORPOR_EVICTION_NOTICE)")
		f.StringVar(&cfg.MetadataURL, "metadata-url", cfg.MetadataURL, "base URL of the cloud metadata service (default: the cloud's own)")
		f.DurationVar(&cfg.EvictionPoll, "eviction-poll", cfg.EvictionPoll, "how often to poll for eviction notices")
	}
	return cmd
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
