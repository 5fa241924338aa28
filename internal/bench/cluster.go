package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/miniosrv"
)

// A process cluster: one `torpor gateway` (with the embedded NATS
// JetStream other nodes join) and N `torpor worker` processes, all
// children of this process, sharing one snapshot store and cluster key.
// Benchmarks of eviction and crashes signal single workers and restart
// them; everything else they do goes through the gateway's public API,
// like the platform benchmarks.

// ClusterConfig describes a cluster to start. The zero value of a field
// means its default.
type ClusterConfig struct {
	// Binary is the torpor binary; default os.Executable(). A torpor-init
	// beside it is used for sandboxes (sandbox.FindInit), as in an install.
	Binary string
	// Dir holds every node's home (Dir/gateway, Dir/w1, ...), its log
	// (Dir/gateway.log, Dir/w1.log, ...) and the cluster key; it is
	// created. Required.
	Dir string
	// Workers is the number of worker processes (at least 1).
	Workers int
	// Store is --snapshot-store for every node; "" is Dir/snapshots, a
	// local directory all of them share.
	Store string
	// Extra are more flags for every worker, e.g. --sandbox-network=host,
	// --eviction-grace=5s, --templates=false. They come last, so they
	// override the harness's own.
	Extra []string
	// GatewayExtra are more flags for the gateway, e.g. --ack-wait=5s.
	GatewayExtra []string
	// Env is more environment for every process (KEY=VALUE), on top of
	// this process's, e.g. AWS_ACCESS_KEY_ID=... for an S3 store.
	Env []string
	// Log receives the harness's own messages (not the nodes'); nil
	// discards them.
	Log *slog.Logger
}

// Timing of the harness.
const (
	// clusterStartTimeout bounds the start of the gateway, and of the
	// workers until the gateway lists them all.
	clusterStartTimeout = 60 * time.Second
	// clusterStopTimeout bounds a graceful Close; then what is left is
	// killed. The gateway gets at least clusterGatewayGrace of it, after
	// the workers, since they need its NATS to hand their calls over.
	clusterStopTimeout  = 30 * time.Second
	clusterGatewayGrace = 5 * time.Second
	// clusterPoll is how often start-up is polled.
	clusterPoll = 50 * time.Millisecond
	// clusterLogTail is how much of a node's log an error quotes.
	clusterLogTail = 4000
)

// Cluster is a running gateway and its workers, children of this process.
// The kernel kills them if this process dies without closing it.
type Cluster struct {
	cfg       ClusterConfig
	log       *slog.Logger
	cli       *client.Client
	endpoint  string
	natsURL   string
	natsToken string
	keyFile   string
	ids       []string
	gateway   *child

	mu      sync.Mutex
	workers map[string]*child // the latest process of each worker id
	closing sync.Once
}

// child is one process of the cluster.
type child struct {
	name    string // "gateway" or a worker id
	logPath string
	cmd     *exec.Cmd
	started time.Time // just before it was started
	done    chan struct{}
	err     error // how it exited; set before done is closed
}

func (p *child) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// StartCluster starts the gateway, then cfg.Workers workers (w1, w2, ...),
// and returns when the gateway lists them all. On an error nothing it
// started is left running.
func StartCluster(ctx context.Context, cfg ClusterConfig) (_ *Cluster, err error) {
	if cfg.Workers < 1 {
		return nil, errdefs.Invalid(fmt.Sprintf("cluster: %d workers: start at least 1", cfg.Workers))
	}
	if cfg.Dir == "" {
		return nil, errdefs.Invalid("cluster: no directory for the nodes' homes and logs: set ClusterConfig.Dir")
	}
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: create %s: %w", cfg.Dir, err)
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("cluster: find the torpor binary: %w: set ClusterConfig.Binary", err)
		}
	}
	if _, err := os.Stat(cfg.Binary); err != nil {
		return nil, fmt.Errorf("cluster: torpor binary: %w: build it with `go build -o PATH ./cmd/torpor`", err)
	}
	if cfg.Store == "" {
		cfg.Store = filepath.Join(cfg.Dir, "snapshots")
		if err := os.MkdirAll(cfg.Store, 0o700); err != nil {
			return nil, fmt.Errorf("cluster: create the snapshot store: %w", err)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{cfg: cfg, log: cfg.Log, keyFile: filepath.Join(cfg.Dir, "cluster-key"), workers: map[string]*child{}}
	for i := range cfg.Workers {
		c.ids = append(c.ids, "w"+strconv.Itoa(i+1))
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.startGateway(ctx); err != nil {
		return nil, err
	}
	var started []*child
	for _, id := range c.ids {
		p, err := c.startWorker(id)
		if err != nil {
			return nil, err
		}
		started = append(started, p)
	}
	if err := c.waitListed(ctx, started); err != nil {
		return nil, err
	}
	c.log.Info("cluster is up", "endpoint", c.endpoint, "nats", c.natsURL, "workers", len(c.ids), "dir", cfg.Dir)
	return c, nil
}

// Endpoint is the gateway's API, http://127.0.0.1:PORT.
func (c *Cluster) Endpoint() string { return c.endpoint }

// Token is the gateway's API token: none, since it runs with --auth none.
func (c *Cluster) Token() string { return "" }

// Workers returns the worker ids, w1, w2, ...
func (c *Cluster) Workers() []string { return slices.Clone(c.ids) }

// LogFile returns the log of a worker id, or of "gateway". A restarted
// worker appends to its log.
func (c *Cluster) LogFile(name string) string { return filepath.Join(c.cfg.Dir, name+".log") }

// Signal sends sig to the current process of worker id.
func (c *Cluster) Signal(id string, sig syscall.Signal) error {
	p, err := c.worker(id)
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal worker %s (pid %d): %w", id, p.cmd.Process.Pid, err)
	}
	c.log.Info("signalled worker", "worker", id, "pid", p.cmd.Process.Pid, "signal", sig.String())
	return nil
}

// Wait waits for the current process of worker id to exit and returns how
// it exited: nil on status 0, else an *exec.ExitError.
func (c *Cluster) Wait(ctx context.Context, id string) error {
	p, err := c.worker(id)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("wait for worker %s (pid %d) to exit: %w", id, p.cmd.Process.Pid, ctx.Err())
	}
}

// Restart starts worker id again, with the same home and flags, once its
// previous process has exited (signal it first: Restart waits for that
// exit until ctx ends), and returns when the gateway lists the new
// process.
func (c *Cluster) Restart(ctx context.Context, id string) error {
	old, err := c.worker(id)
	if err != nil {
		return err
	}
	select {
	case <-old.done:
	case <-ctx.Done():
		return fmt.Errorf("restart worker %s: its process (pid %d) is still running: Signal it first: %w",
			id, old.cmd.Process.Pid, ctx.Err())
	}
	c.mu.Lock()
	again := c.workers[id] != old
	c.mu.Unlock()
	if again {
		return fmt.Errorf("restart worker %s: it was restarted meanwhile: %w", id, errdefs.ErrConflict)
	}
	p, err := c.startWorker(id)
	if err != nil {
		return err
	}
	return c.waitListed(ctx, []*child{p})
}

// Close stops the cluster: SIGTERM to every worker, then, once they have
// exited, to the gateway (workers hand their calls over through its
// NATS); whatever is still running after 30 s is killed. Close waits for
// every process and may be called more than once, but not while a
// Restart runs (its new process would be left to Pdeathsig).
func (c *Cluster) Close() {
	c.closing.Do(func() {
		deadline := time.Now().Add(clusterStopTimeout)
		c.mu.Lock()
		ws := make([]*child, 0, len(c.workers))
		for _, p := range c.workers {
			ws = append(ws, p)
		}
		c.mu.Unlock()
		c.stop(ws, deadline)
		if c.gateway != nil {
			c.stop([]*child{c.gateway}, later(deadline, time.Now().Add(clusterGatewayGrace)))
		}
	})
}

// stop sends SIGTERM to ps, waits for them until deadline and kills the
// rest.
func (c *Cluster) stop(ps []*child, deadline time.Time) {
	for _, p := range ps {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range ps {
		select {
		case <-p.done:
			continue
		case <-time.After(time.Until(deadline)):
		}
		c.log.Warn("cluster process did not stop in time: killing it", "proc", p.name, "pid", p.cmd.Process.Pid,
			"log", p.logPath)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// worker returns the current process of worker id.
func (c *Cluster) worker(id string) (*child, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.workers[id]
	if p == nil {
		return nil, errdefs.NotFound(fmt.Sprintf("cluster has no worker %q: its workers are %s", id, strings.Join(c.ids, ", ")))
	}
	return p, nil
}

// startGateway starts the gateway with an embedded NATS on a free port and
// waits until it serves. A port found free may be taken before NATS binds
// it; then another is tried.
func (c *Cluster) startGateway(ctx context.Context) error {
	home := filepath.Join(c.cfg.Dir, "gateway")
	endpointFile := filepath.Join(home, "endpoint")
	tokenFile := filepath.Join(home, "nats", "token")
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		natsAddr, err := miniosrv.FreeLoopbackAddr()
		if err != nil {
			return fmt.Errorf("cluster: find a port for NATS: %w", err)
		}
		// A stale endpoint file (from an earlier cluster in Dir) would
		// point at a dead gateway.
		if err := os.Remove(endpointFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cluster: %w", err)
		}
		args := []string{"gateway", "--home", home, "--listen", "127.0.0.1:0", "--auth", "none",
			"--nats-listen", natsAddr, "--snapshot-store", c.cfg.Store, "--cluster-key-file", c.keyFile}
		p, err := c.startChild("gateway", append(args, c.cfg.GatewayExtra...))
		if err != nil {
			return err
		}
		c.gateway = p
		last = c.waitGateway(ctx, p, endpointFile, tokenFile)
		if last == nil {
			c.natsURL = "nats://" + natsAddr
			return nil
		}
		if !p.exited() {
			break
		}
		if tail := logTail(p.logPath); !strings.Contains(tail, "address already in use") &&
			!strings.Contains(tail, "NATS did not become ready") {
			break
		}
	}
	return last
}

// waitGateway polls until the gateway has written its endpoint and NATS
// token and answers /healthz.
func (c *Cluster) waitGateway(ctx context.Context, p *child, endpointFile, tokenFile string) error {
	ctx, cancel := context.WithTimeout(ctx, clusterStartTimeout)
	defer cancel()
	tick := time.NewTicker(clusterPoll)
	defer tick.Stop()
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("cluster: the gateway exited while starting (%v); the end of %s:\n%s", p.err, p.logPath, logTail(p.logPath))
		}
		if last = c.gatewayReady(ctx, endpointFile, tokenFile); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: the gateway did not serve within %s (%v: %w); the end of %s:\n%s",
				clusterStartTimeout, last, ctx.Err(), p.logPath, logTail(p.logPath))
		case <-tick.C:
		}
	}
}

func (c *Cluster) gatewayReady(ctx context.Context, endpointFile, tokenFile string) error {
	b, err := os.ReadFile(endpointFile)
	if err != nil {
		return err
	}
	endpoint := strings.TrimSpace(string(b))
	if !strings.HasPrefix(endpoint, "http://") {
		return fmt.Errorf("endpoint file %s holds %q, not a URL", endpointFile, endpoint)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("NATS token: %w", err)
	}
	if err := checkHealth(ctx, endpoint); err != nil {
		return err
	}
	cli, err := client.New(endpoint, client.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}))
	if err != nil {
		return err
	}
	c.endpoint, c.natsToken, c.cli = endpoint, strings.TrimSpace(string(tok)), cli
	return nil
}

// startWorker starts a process for worker id and makes it the current one.
func (c *Cluster) startWorker(id string) (*child, error) {
	args := []string{"worker", "--home", filepath.Join(c.cfg.Dir, id), "--worker-id", id,
		"--nats", c.natsURL, "--nats-token", c.natsToken,
		"--snapshot-store", c.cfg.Store, "--cluster-key-file", c.keyFile}
	p, err := c.startChild(id, append(args, c.cfg.Extra...))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.workers[id] = p
	c.mu.Unlock()
	return p, nil
}

// waitListed polls GET /v1/workers until it lists every process of ps as
// started: an entry of its id updated after the process started (the
// entry of a killed process outlives it by up to bus.WorkerTTL).
func (c *Cluster) waitListed(ctx context.Context, ps []*child) error {
	ctx, cancel := context.WithTimeout(ctx, clusterStartTimeout)
	defer cancel()
	tick := time.NewTicker(clusterPoll)
	defer tick.Stop()
	pending := slices.Clone(ps)
	var last error
	for {
		for _, p := range pending {
			if p.exited() {
				return fmt.Errorf("cluster: worker %s exited while starting (%v); the end of %s:\n%s", p.name, p.err, p.logPath, logTail(p.logPath))
			}
		}
		if c.gateway.exited() {
			return fmt.Errorf("cluster: the gateway exited (%v); the end of %s:\n%s", c.gateway.err, c.gateway.logPath, logTail(c.gateway.logPath))
		}
		var list []api.WorkerSummary
		if list, last = c.cli.Workers(ctx); last == nil {
			pending = slices.DeleteFunc(pending, func(p *child) bool { return listedSince(list, p.name, p.started) })
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			p := pending[0]
			why := "it is not listed"
			if last != nil {
				why = "GET /v1/workers: " + last.Error()
			}
			return fmt.Errorf("cluster: worker %s did not join within %s (%s: %w); the end of %s:\n%s",
				p.name, clusterStartTimeout, why, ctx.Err(), p.logPath, logTail(p.logPath))
		case <-tick.C:
		}
	}
}

// listedSince reports whether list has an entry of id updated at or after
// t.
func listedSince(list []api.WorkerSummary, id string, t time.Time) bool {
	for _, w := range list {
		if w.ID != id {
			continue
		}
		u, err := time.Parse(time.RFC3339Nano, w.UpdatedAt)
		return err == nil && !u.Before(t)
	}
	return false
}

// startChild starts the torpor binary with args, its output appended to
// Dir/name.log. The child gets its own process group, so that a Ctrl-C
// at the terminal reaches only this process, which decides when the
// cluster stops, and dies with this process (Pdeathsig).
func (c *Cluster) startChild(name string, args []string) (*child, error) {
	logPath := c.LogFile(name)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cluster: log of %s: %w", name, err)
	}
	defer f.Close() // the child has its own copy
	fmt.Fprintf(f, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), c.cfg.Binary, strings.Join(redact(args), " "))
	cmd := exec.Command(c.cfg.Binary, args...)
	cmd.Env = append(os.Environ(), c.cfg.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	setPdeathsig(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	p := &child{name: name, logPath: logPath, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cluster: start %s (%s): %w", name, c.cfg.Binary, err)
	}
	c.log.Info("cluster process started", "proc", name, "pid", cmd.Process.Pid, "log", logPath)
	go func() {
		p.err = cmd.Wait()
		c.log.Info("cluster process exited", "proc", name, "pid", cmd.Process.Pid, "err", p.err)
		close(p.done)
	}()
	return p, nil
}

// redact hides the NATS token in args, for the log.
func redact(args []string) []string {
	out := slices.Clone(args)
	for i := 1; i < len(out); i++ {
		if out[i-1] == "--nats-token" {
			out[i] = "(redacted)"
		}
	}
	return out
}

// logTail returns the end of the log at path, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	var prefix string
	if st, err := f.Stat(); err == nil && st.Size() > clusterLogTail {
		if _, err := f.Seek(st.Size()-clusterLogTail, io.SeekStart); err == nil {
			prefix = "..."
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if s := strings.TrimSpace(string(b)); s != "" {
		return prefix + s
	}
	return "(empty)"
}
