// Package app wires torpor's roles together, explicitly and in one place:
// the bus, the registry, the gateway and the worker, and their lifecycle. It
// holds no business logic.
package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/blobopen"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/dispatch"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/notice"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/criu"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
	"github.com/torpor-dev/torpor/internal/worker"
)

// Roles selects what a process runs.
type Roles struct {
	Gateway bool
	Worker  bool
}

// Run starts the selected roles and blocks until ctx is cancelled, then
// shuts down gracefully: the HTTP server stops accepting, running calls
// finish (bounded), instances are stopped, NATS is drained.
func Run(ctx context.Context, cfg config.Config, roles Roles, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Home, 0o700); err != nil {
		return fmt.Errorf("create home %s: %w", cfg.Home, err)
	}
	if err := os.Chmod(cfg.Home, 0o700); err != nil {
		return fmt.Errorf("secure home %s: %w", cfg.Home, err)
	}
	if roles.Worker && os.Geteuid() != 0 {
		return errors.New("a worker must run as root (it creates namespaces and cgroups for sandboxes): run `sudo torpor up`")
	}
	// Load the API token before opening anything, so that a bad token file
	// fails fast, and before the endpoint file appears, so that a client
	// that waits for that file finds the token there too.
	var apiToken string
	if roles.Gateway {
		var err error
		if apiToken, err = loadAPIToken(cfg, log); err != nil {
			return err
		}
	}
	// Resolve the runtime before opening anything, so a missing interpreter
	// fails fast with a clear message.
	var py config.Interpreter
	if roles.Worker {
		var err error
		if py, err = config.ResolvePython(ctx, cfg.Python); err != nil {
			return err
		}
	}

	b, err := bus.Open(ctx, bus.Config{URL: cfg.NATSURL, StoreDir: filepath.Join(cfg.Home, "nats"), Listen: cfg.NATSListen,
		Token: cfg.NATSToken, CallRetention: cfg.Retention, AckWait: cfg.AckWait}, log.With("part", "bus"))
	if err != nil {
		return err
	}
	defer b.Close()
	if u := b.ClientURL(); u != "" {
		log.Info("NATS listening for other nodes", "url", u, "token_file", filepath.Join(cfg.Home, "nats", "token"))
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg, err := registry.New(runCtx, b.Functions, b.Code, log.With("part", "registry"))
	if err != nil {
		return err
	}
	calls := callstore.New(b.Calls)
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Shutdown runs in reverse order of start-up, each step bounded.
	var closers []func(context.Context)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i](sctx)
		}
	}()

	var w *worker.Worker
	if roles.Worker {
		// The small torpor-init beside this binary starts ~10 ms faster
		// than this binary re-executed (sandbox.FindInit).
		var initPath string
		if exe, err := os.Executable(); err == nil {
			initPath = sandbox.FindInit(ctx, exe)
		}
		sbm, err := sandbox.NewManager(ctx, sandbox.Config{StateDir: filepath.Join(cfg.Home, "sandbox"), InitPath: initPath,
			TotalMemoryMB: cfg.SandboxMemoryMB, KeepCgroupOptions: cfg.KeepCgroupOptions}, log.With("part", "sandbox"))
		if err != nil {
			return fmt.Errorf("sandboxes: %w", err)
		}
		closers = append(closers, func(ctx context.Context) {
			if err := sbm.Close(ctx); err != nil {
				log.Warn("close sandboxes", "err", err)
			}
		})
		w, err = worker.New(ctx, worker.Config{ID: cfg.WorkerID, Home: cfg.Home, Python: py.Path, PythonHome: py.Prefix,
			IdleTTL: cfg.IdleTTL, MaxIdle: cfg.MaxIdle, AsyncSlots: cfg.AsyncSlots, PidsLimit: cfg.PidsLimit, TmpMB: cfg.TmpMB,
			HostNetwork: cfg.SandboxNetwork == "host", MemoryBudgetMB: cfg.MemoryBudgetMB,
			NoTemplates: !cfg.Templates, TemplateTTL: cfg.TemplateTTL, ReclaimLowMB: cfg.ReclaimLowMB, ReclaimHighMB: cfg.ReclaimHighMB,
			EvictionGrace: cfg.EvictionGrace, ShortestGrace: shortestGrace(cfg, time.Now())},
			b, reg, calls, sbm, worker.NewMetrics(promReg), log.With("part", "worker"))
		if err != nil {
			return err
		}
		if err := enableSnapshots(ctx, cfg, w, &closers, log.With("part", "snapshot")); err != nil {
			return err
		}
		if err := w.Start(runCtx); err != nil {
			return err
		}
		closers = append(closers, w.Close)
	}

	var srv *http.Server
	srvErr := make(chan error, 1)
	if roles.Gateway {
		var local dispatch.Local
		if w != nil {
			local = w
		}
		dir, err := dispatch.NewDirectory(runCtx, b, reg, log.With("part", "directory"))
		if err != nil {
			return err
		}
		d := dispatch.New(b, reg, calls, local, dir, log.With("part", "dispatch"))
		store, keys, err := OpenSnapshotStore(ctx, cfg)
		if err != nil {
			return err
		}
		h := gateway.New(d, gateway.Options{Log: log.With("part", "gateway"), Registry: promReg, Token: apiToken,
			Snapshots: dispatch.NewSnapshots(b, reg, calls, store, keys), Workers: dir})
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w (is another torpor running? pick another address with --listen)", cfg.Listen, err)
		}
		endpoint := "http://" + ln.Addr().String()
		if err := os.WriteFile(filepath.Join(cfg.Home, "endpoint"), []byte(endpoint+"\n"), 0o644); err != nil {
			return fmt.Errorf("write endpoint file: %w", err)
		}
		// ReadTimeout covers a 50 MB deploy on a slow link; IdleTimeout
		// reclaims keep-alive connections clients forgot.
		srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 5 * time.Minute,
			IdleTimeout: 2 * time.Minute}
		go func() { srvErr <- srv.Serve(ln) }()
		closers = append(closers, func(ctx context.Context) { _ = srv.Shutdown(ctx) })
		serving := []any{"endpoint", endpoint, "home", cfg.Home, "auth", string(cfg.Auth)}
		if apiToken != "" {
			serving = append(serving, "api_token_file", cfg.APITokenPath())
		}
		log.Info("torpor is serving", serving...)
	}

	var evicted <-chan struct{}
	if w != nil {
		evicted = w.Evicted()
		if err := watchNotices(runCtx, cfg, w, log.With("part", "notice")); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		if w != nil {
			// SIGTERM is how a node is told it goes away (spot reclaim,
			// scale-in, systemd stop): move running calls first.
			w.Evict(context.WithoutCancel(ctx), cfg.EvictionGrace, "SIGTERM")
		}
	case <-evicted:
	case err := <-srvErr:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	}
	log.Info("shutting down")
	return nil
}

// watchNotices polls the cloud's metadata service for an eviction notice
// (--eviction-notice) and evicts the worker when one comes.
func watchNotices(ctx context.Context, cfg config.Config, w *worker.Worker, log *slog.Logger) error {
	src, err := notice.New(cfg.EvictionNotice, cfg.MetadataURL)
	if err != nil || src == nil {
		return err
	}
	log.Info("watching for eviction notices", "provider", src.Provider(), "every", cfg.EvictionPoll)
	go func() {
		n, err := notice.Watch(ctx, src, cfg.EvictionPoll, log)
		if err != nil {
			return // ctx ended: the worker is shutting down anyway
		}
		w.Evict(context.WithoutCancel(ctx), noticeGrace(n, cfg.EvictionGrace, time.Now()), n.Provider+" eviction notice: "+n.Detail)
		if az, ok := src.(*notice.Azure); ok && n.Detail != "" {
			// The calls are gone: let Azure go ahead now rather than at
			// NotBefore.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := az.Acknowledge(actx, n.Detail); err != nil {
				log.Warn("acknowledge the eviction", "err", err)
			}
		}
	}()
	return nil
}

// shortestGrace is the shortest grace an eviction of this worker may get:
// --eviction-grace, or the grace of the shortest notice its cloud gives.
func shortestGrace(cfg config.Config, now time.Time) time.Duration {
	g := cfg.EvictionGrace
	if warn := notice.MinWarning(cfg.EvictionNotice); warn > 0 {
		g = min(g, noticeGrace(notice.Notice{Deadline: now.Add(warn)}, g, now))
	}
	return g
}

// noticeGrace is the grace period of an eviction announced by n: until its
// deadline, less a margin for the worker to exit (a sixth, at most 5 s),
// or def when the provider names no deadline.
func noticeGrace(n notice.Notice, def time.Duration, now time.Time) time.Duration {
	if n.Deadline.IsZero() {
		return def
	}
	left := n.Deadline.Sub(now)
	return max(left-min(left/6, 5*time.Second), 0)
}

// loadAPIToken returns the token the gateway requires, creating the token
// file on first start, or "" with a warning under --auth none.
func loadAPIToken(cfg config.Config, log *slog.Logger) (string, error) {
	if cfg.Auth == config.AuthNone {
		log.Warn("authentication is off (--auth none): anyone who can reach the API can deploy and run code; "+
			"use it only for tests or on a trusted network", "listen", cfg.Listen)
		return "", nil
	}
	tok, err := config.LoadAPIToken(cfg.APITokenPath())
	if err != nil {
		return "", err
	}
	if tok.Created {
		log.Info("created the API token: clients on this machine read it; elsewhere set TORPOR_TOKEN to its contents",
			"file", tok.Path)
	}
	if tok.Mode&0o077 != 0 {
		log.Warn("the API token file is readable by other users: chmod 600 it", "file", tok.Path,
			"mode", fmt.Sprintf("%04o", tok.Mode))
	}
	return tok.Value, nil
}

// enableSnapshots gives the worker a snapshot service: CRIU, the snapshot
// store and the cluster key. Without a usable CRIU the worker still runs
// (every instance starts cold) and says why; a bad store or key is an error.
func enableSnapshots(ctx context.Context, cfg config.Config, w *worker.Worker, closers *[]func(context.Context), log *slog.Logger) error {
	svc, err := OpenSnapshots(ctx, cfg, log)
	if errors.Is(err, errdefs.ErrUnavailable) {
		log.Warn("snapshots disabled", "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	*closers = append(*closers, func(context.Context) {
		if err := svc.Close(); err != nil {
			log.Warn("close snapshot service", "err", err)
		}
	})
	return w.EnableSnapshots(ctx, svc)
}

// OpenSnapshots wires a snapshot service as cfg says. Its error wraps
// errdefs.ErrUnavailable when CRIU is missing or cannot run here.
func OpenSnapshots(ctx context.Context, cfg config.Config, log *slog.Logger) (*snapshot.Service, error) {
	engine, err := criu.New(ctx, cfg.CRIU, "")
	if err != nil {
		return nil, err
	}
	store, keys, err := OpenSnapshotStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(cfg.Home))
	return snapshot.NewService(engine, store, keys, snapshot.ServiceConfig{
		EngineVersion: engine.Version(), Compression: image.Compression(cfg.SnapshotCompression),
		CacheName: "torpor-images-" + hex.EncodeToString(sum[:6]),
	}, log)
}

// OpenSnapshotStore opens the snapshot store and the cluster key.
func OpenSnapshotStore(ctx context.Context, cfg config.Config) (blob.Store, *image.Keyring, error) {
	store, err := blobopen.Open(ctx, cfg.SnapshotStoreSpec())
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot store: %w", err)
	}
	keys, err := image.LoadOrCreateKey(cfg.ClusterKeyPath())
	if err != nil {
		return nil, nil, fmt.Errorf("cluster key: %w", err)
	}
	return store, keys, nil
}
