// Package config is torpor's one typed configuration tree: defaults,
// validation, and the TORPOR_* environment overlay. It is loaded once in
// cmd/torpor and passed down; nothing else reads flags or the environment.
package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Config is everything a torpor server process needs.
type Config struct {
	Home     string // state root ($TORPOR_HOME, default ~/.torpor)
	Listen   string // HTTP API address
	LogLevel string // debug|info|warn|error

	// Auth says whether the HTTP API asks callers for the API token.
	Auth AuthMode
	// APITokenFile holds the API token; empty means <Home>/api-token (see
	// APITokenPath), so that it follows --home.
	APITokenFile string

	NATSURL    string        // external NATS; empty = embedded
	NATSListen string        // embedded server's TCP listener for other nodes; empty = in-process only
	NATSToken  string        // token for NATSURL / NATSListen
	AckWait    time.Duration // async redelivery timeout without heartbeats
	Retention  time.Duration // call records and logs

	WorkerID   string
	Python     string // interpreter (name on PATH or absolute path)
	IdleTTL    time.Duration
	MaxIdle    int
	AsyncSlots int
	PidsLimit  int
	TmpMB      int
	// SandboxNetwork is "none" (each instance in its own network namespace
	// with only loopback) or "host" (share the host's: trusted tenants only).
	SandboxNetwork string
	// MemoryBudgetMB caps the summed memory limits of a worker's live
	// instances (0: three quarters of the machine's memory).
	MemoryBudgetMB int
	// Templates turns the fork path (runtime and function templates) on;
	// TemplateTTL stops a function template unused this long.
	Templates   bool
	TemplateTTL time.Duration
	// ReclaimLowMB and ReclaimHighMB are the memory reclaimer's watermarks
	// on the host's available memory (0: 5 % and 10 % of the machine).
	ReclaimLowMB, ReclaimHighMB int
	// SandboxMemoryMB caps the memory of all of a worker's sandboxes
	// together (0: no cap of their own).
	SandboxMemoryMB int
	// KeepCgroupOptions: do not set favordynmods on the host's cgroup2
	// mount (sandbox.Config.KeepCgroupOptions).
	KeepCgroupOptions bool

	// SnapshotStore is where snapshot images go: a directory or
	// s3://bucket/prefix?endpoint=… (see blobopen); empty means
	// <Home>/snapshots. Every node of a cluster must name the same store.
	SnapshotStore string
	// ClusterKeyFile holds the key snapshots are signed with; empty means
	// <Home>/cluster-key. Every node of a cluster needs the same key.
	ClusterKeyFile string
	// CRIU is the criu binary to use; empty finds it (see criu.New).
	CRIU string
	// SnapshotCompression is zstd, lz4 or none.
	SnapshotCompression string

	// EvictionGrace is how long a worker has, from SIGTERM or an evict
	// request, to move its running calls elsewhere before it exits.
	EvictionGrace time.Duration
	// EvictionNotice names the cloud whose eviction notices the worker
	// polls (aws, gcp, azure; none or empty: no polling); MetadataURL
	// overrides that cloud's metadata endpoint (tests, proxies);
	// EvictionPoll is how often it asks.
	EvictionNotice string
	MetadataURL    string
	EvictionPoll   time.Duration
}

// SnapshotStoreSpec is the snapshot store: --snapshot-store, or the
// directory snapshots under the home directory.
func (c *Config) SnapshotStoreSpec() string {
	if c.SnapshotStore != "" {
		return c.SnapshotStore
	}
	return filepath.Join(c.Home, "snapshots")
}

// ClusterKeyPath is the snapshot signing key: --cluster-key-file, or
// cluster-key in the home directory.
func (c *Config) ClusterKeyPath() string {
	if c.ClusterKeyFile != "" {
		return c.ClusterKeyFile
	}
	return filepath.Join(c.Home, "cluster-key")
}

// AuthMode is how the gateway authenticates callers of its HTTP API.
type AuthMode string

// Auth modes.
const (
	// AuthToken requires the API token on every route but GET /healthz.
	AuthToken AuthMode = "token"
	// AuthNone lets anyone who reaches the listener deploy and run code:
	// for tests and trusted networks only.
	AuthNone AuthMode = "none"
)

// APITokenFileName is the API token's file in the home directory. Servers
// create it; the CLI reads it when no token is given, so that on the
// server's machine, as the server's user, no setup is needed.
const APITokenFileName = "api-token"

// DefaultHome is the state root when no --home is given: $TORPOR_HOME, else
// ~/.torpor, else /var/lib/torpor when there is no user home directory.
func DefaultHome() string {
	if home := os.Getenv("TORPOR_HOME"); home != "" {
		return home
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".torpor")
	}
	return "/var/lib/torpor"
}

// Default returns the defaults, overlaid with TORPOR_* environment variables.
func Default() Config {
	host, _ := os.Hostname()
	c := Config{
		Home: DefaultHome(), Listen: "127.0.0.1:8080", LogLevel: "info", Auth: AuthToken,
		AckWait: 30 * time.Second, Retention: 7 * 24 * time.Hour,
		WorkerID: host, Python: "python3", IdleTTL: 10 * time.Minute, MaxIdle: 256,
		Templates: true, TemplateTTL: time.Hour,
		PidsLimit: 128, TmpMB: 512, SandboxNetwork: "none", SnapshotCompression: "zstd",
		EvictionGrace: 30 * time.Second, EvictionPoll: 2 * time.Second,
	}
	env := map[string]*string{
		"TORPOR_LISTEN": &c.Listen, "TORPOR_LOG_LEVEL": &c.LogLevel, "TORPOR_NATS": &c.NATSURL,
		"TORPOR_NATS_LISTEN": &c.NATSListen, "TORPOR_NATS_TOKEN": &c.NATSToken, "TORPOR_WORKER_ID": &c.WorkerID,
		"TORPOR_PYTHON": &c.Python, "TORPOR_AUTH": (*string)(&c.Auth), "TORPOR_API_TOKEN_FILE": &c.APITokenFile,
		"TORPOR_SNAPSHOT_STORE": &c.SnapshotStore, "TORPOR_CLUSTER_KEY_FILE": &c.ClusterKeyFile, "TORPOR_CRIU": &c.CRIU,
		"TORPOR_EVICTION_NOTICE": &c.EvictionNotice,
	}
	for k, p := range env {
		if v, ok := os.LookupEnv(k); ok {
			*p = v
		}
	}
	return c
}

// APITokenPath is the file holding the API token: --api-token-file, or
// api-token in the home directory.
func (c *Config) APITokenPath() string {
	if c.APITokenFile != "" {
		return c.APITokenFile
	}
	return filepath.Join(c.Home, APITokenFileName)
}

// Validate checks the config and says what to change.
func (c *Config) Validate() error {
	var errs []error
	if c.Home == "" {
		errs = append(errs, errors.New("--home is empty: set it or TORPOR_HOME"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: want HOST:PORT: %w", c.Listen, err))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level %q: use debug, info, warn or error", c.LogLevel))
	}
	switch c.SnapshotCompression {
	case "", "zstd", "lz4", "none": // empty: zstd
	default:
		errs = append(errs, fmt.Errorf("--snapshot-compression %q: use zstd, lz4 or none", c.SnapshotCompression))
	}
	switch c.Auth {
	case AuthToken, AuthNone:
	default:
		errs = append(errs, fmt.Errorf("--auth %q: use token (the default) or none (tests and trusted networks only)", c.Auth))
	}
	if c.NATSURL != "" && !strings.Contains(c.NATSURL, "://") {
		errs = append(errs, fmt.Errorf("--nats %q: want a URL such as nats://127.0.0.1:4222", c.NATSURL))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("--ack-wait %s: use at least 1s", c.AckWait))
	}
	if c.IdleTTL < time.Second {
		errs = append(errs, fmt.Errorf("--idle-ttl %s: use at least 1s", c.IdleTTL))
	}
	if c.PidsLimit < 8 {
		errs = append(errs, fmt.Errorf("--pids-limit %d: use at least 8", c.PidsLimit))
	}
	if c.TmpMB < 1 {
		errs = append(errs, fmt.Errorf("--tmp-mb %d: use at least 1", c.TmpMB))
	}
	for flag, v := range map[string]int{"--max-idle": c.MaxIdle, "--async-slots": c.AsyncSlots} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s %d: use 0 (the default) or more", flag, v))
		}
	}
	if c.Retention < time.Minute {
		errs = append(errs, fmt.Errorf("--retention %s: use at least 1m", c.Retention))
	}
	if c.ReclaimLowMB < 0 || c.ReclaimHighMB < 0 || c.ReclaimHighMB != 0 && c.ReclaimHighMB <= c.ReclaimLowMB {
		errs = append(errs, fmt.Errorf("--reclaim-low-mb %d / --reclaim-high-mb %d: use 0 (automatic) or low < high", c.ReclaimLowMB, c.ReclaimHighMB))
	}
	if c.SandboxMemoryMB < 0 {
		errs = append(errs, fmt.Errorf("--sandbox-memory-mb %d: use 0 (no cap) or a size in MB", c.SandboxMemoryMB))
	}
	if c.TemplateTTL < 0 {
		errs = append(errs, fmt.Errorf("--template-ttl %s: use a positive duration", c.TemplateTTL))
	}
	if c.MemoryBudgetMB < 0 {
		errs = append(errs, fmt.Errorf("--memory-budget %d: use 0 (automatic) or a size in MB", c.MemoryBudgetMB))
	}
	if c.SandboxNetwork != "none" && c.SandboxNetwork != "host" {
		errs = append(errs, fmt.Errorf("--sandbox-network %q: use none (isolated, the default) or host (trusted tenants only)", c.SandboxNetwork))
	}
	if c.EvictionGrace < 0 {
		errs = append(errs, fmt.Errorf("--eviction-grace %s: use 0 (stop at once) or a positive duration", c.EvictionGrace))
	}
	switch c.EvictionNotice {
	case "", "none":
	case "aws", "gcp", "azure":
		// The poll interval matters only to a poller.
		if c.EvictionPoll < 100*time.Millisecond {
			errs = append(errs, fmt.Errorf("--eviction-poll %s: use at least 100ms", c.EvictionPoll))
		}
	default:
		errs = append(errs, fmt.Errorf("--eviction-notice %q: use aws, gcp, azure or none", c.EvictionNotice))
	}
	if c.WorkerID == "" {
		errs = append(errs, errors.New("--worker-id is empty"))
	}
	return errors.Join(errs...)
}

// Interpreter is a resolved language runtime.
type Interpreter struct {
	Path   string // real executable (not a shim)
	Prefix string // installation prefix (sys.base_prefix)
}

// ResolvePython finds the real interpreter behind name, which may be a
// pyenv-style shim: shims cost tens of ms per start and do not work inside a
// sandbox.
func ResolvePython(ctx context.Context, name string) (Interpreter, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return Interpreter{}, fmt.Errorf("python interpreter %q not found: install python3 or pass --python PATH: %w", name, err)
	}
	out, err := exec.CommandContext(ctx, path, "-c", "import os, sys; print(os.readlink('/proc/self/exe')); print(sys.base_prefix); print('%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		return Interpreter{}, fmt.Errorf("run %s: %w", path, err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(f) != 3 {
		return Interpreter{}, fmt.Errorf("unexpected answer from %s: %q", path, out)
	}
	var major, minor int
	if _, err := fmt.Sscanf(f[2], "%d.%d", &major, &minor); err != nil || major != 3 || minor < 8 {
		return Interpreter{}, fmt.Errorf("%s is Python %s: torpor needs Python 3.8 or newer", f[0], f[2])
	}
	exe, err := filepath.EvalSymlinks(f[0])
	if err != nil {
		return Interpreter{}, fmt.Errorf("resolve %s: %w", f[0], err)
	}
	return Interpreter{Path: exe, Prefix: f[1]}, nil
}
