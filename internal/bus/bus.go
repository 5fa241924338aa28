// Package bus owns torpor's messaging: it starts the embedded NATS server
// (or connects to an external one), and declares every subject, stream, KV
// bucket and object store the other packages use. It knows nothing about
// functions or calls beyond their names on the wire.
package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxPayload is the NATS max_payload torpor needs: a 6 MB Lambda payload
// plus headers. The embedded server is configured with it; an external server
// must allow at least this much (Open refuses one that does not).
const MaxPayload = 8 << 20

// Subjects, streams and buckets.
const (
	// SubjInvoke + function name: synchronous calls (request/reply, queue group Workers);
	// InvokeWorkerSubject addresses one worker.
	SubjInvoke = "torpor.invoke."
	// SubjWorkerInfo + worker token (WorkerInfoSubject): a worker's
	// processes and their memory (reply: api.WorkerInfo).
	SubjWorkerInfo = "torpor.workers.info."
	// SubjDrop: broadcast; every worker stops idle instances (and templates)
	// of a function and replies with its api.DropResult.
	SubjDrop = "torpor.workers.drop"
	// SubjValidate: deploy-time validation requests (queue group Workers).
	SubjValidate = "torpor.validate"
	// SubjSnapshot: requests to snapshot an instance (queue group Workers);
	// SnapshotSubject(worker) addresses one worker.
	SubjSnapshot = "torpor.snapshot"
	// SubjCalls + function name: durable async calls in StreamCalls.
	SubjCalls = "torpor.calls."
	// SubjResume + function name: calls checkpointed while they ran
	// (eviction, slice end), waiting in StreamCalls for a worker to
	// restore and finish them.
	SubjResume = "torpor.resume."
	// SubjEvict + worker token (EvictSubject): start that worker's eviction.
	SubjEvict = "torpor.workers.evict."
	// SubjLogs + function name: batches of log lines in StreamLogs.
	SubjLogs = "torpor.logs."

	// Workers is the queue group every worker joins.
	Workers = "workers"

	// StreamCalls is the work queue of accepted async calls.
	StreamCalls = "TORPOR_CALLS"
	// StreamLogs holds functions' log lines, batched per call.
	StreamLogs = "TORPOR_LOGS"
	// BucketFuncs is the KV bucket of function versions (see registry).
	BucketFuncs = "torpor_functions"
	// BucketCalls is the KV bucket of call records (see callstore).
	BucketCalls = "torpor_calls"
	// BucketCode is the object store of code packages, by sha256.
	BucketCode = "torpor_code"
	// BucketSnapshots maps "<function>.<version>" to the snapshot new
	// instances of that version start from (see worker).
	BucketSnapshots = "torpor_snapshots"
	// BucketWorkers is the worker directory: each live worker's
	// api.WorkerSummary under WorkerKey(id), refreshed every WorkerRefresh.
	BucketWorkers = "torpor_workers"
	// ConsumerCalls is the durable consumer all workers pull async calls from.
	ConsumerCalls = "workers"
)

// The worker directory's timing: a worker puts its summary whenever what it
// holds changes and at least every WorkerRefresh; an entry not refreshed for
// WorkerTTL (a worker that died without deleting it) expires.
const (
	WorkerRefresh = 2 * time.Second
	WorkerTTL     = 10 * time.Second
)

// Config says where NATS is.
type Config struct {
	// URL of an external NATS server with JetStream; empty starts an embedded one.
	URL string
	// StoreDir is the embedded server's JetStream directory.
	StoreDir string
	// Listen, when set, makes the embedded server accept TCP clients (other
	// workers) on this address, authenticated with a token kept in StoreDir.
	Listen string
	// Token authenticates with an external server (or the embedded one's listener).
	Token string
	// CallRetention is how long call records and log lines are kept.
	CallRetention time.Duration
	// AckWait bounds how long an async call may go without a progress
	// heartbeat before JetStream redelivers it to another worker.
	AckWait time.Duration
}

// Bus is a live connection to NATS JetStream with torpor's streams declared.
type Bus struct {
	NC        *nats.Conn            // the connection (in-process to the embedded server)
	JS        jetstream.JetStream   // JetStream over NC
	Functions jetstream.KeyValue    // BucketFuncs
	Calls     jetstream.KeyValue    // BucketCalls
	Code      jetstream.ObjectStore // BucketCode
	Snapshots jetstream.KeyValue    // BucketSnapshots
	Workers   jetstream.KeyValue    // BucketWorkers
	CallQueue jetstream.Stream      // StreamCalls
	Logs      jetstream.Stream      // StreamLogs

	srv *server.Server // nil when connected to an external server
	log *slog.Logger
	cfg Config
}

// Open starts or connects to NATS and declares torpor's streams and buckets.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Bus, error) {
	if cfg.CallRetention == 0 {
		cfg.CallRetention = 7 * 24 * time.Hour
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	b := &Bus{log: log, cfg: cfg}
	var err error
	if cfg.URL == "" {
		err = b.startEmbedded()
	} else {
		b.NC, err = nats.Connect(cfg.URL, b.connectOpts(nats.Token(cfg.Token))...)
		if err != nil {
			err = fmt.Errorf("connect to NATS at %s: %w (is the server running with JetStream enabled?)", cfg.URL, err)
		}
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	if mp := b.NC.MaxPayload(); mp < MaxPayload {
		b.Close()
		return nil, fmt.Errorf("NATS server max_payload is %d bytes; torpor needs %d (6 MB payloads): set max_payload: 8MB in the server config", mp, MaxPayload)
	}
	if b.JS, err = jetstream.New(b.NC); err != nil {
		b.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := b.declare(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Bus) connectOpts(extra ...nats.Option) []nats.Option {
	return append([]nats.Option{
		nats.Name("torpor"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				b.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { b.log.Info("NATS reconnected", "url", nc.ConnectedUrl()) }),
	}, extra...)
}

func (b *Bus) startEmbedded() error {
	if err := os.MkdirAll(b.cfg.StoreDir, 0o700); err != nil {
		return fmt.Errorf("create NATS store dir: %w", err)
	}
	opts := &server.Options{
		ServerName: "torpor",
		JetStream:  true,
		StoreDir:   b.cfg.StoreDir,
		MaxPayload: MaxPayload,
		// Every async call is a stream message; keep JetStream's memory share generous.
		JetStreamMaxMemory: 256 << 20,
		DontListen:         b.cfg.Listen == "",
		NoSigs:             true,
		NoLog:              true,
	}
	if b.cfg.Listen != "" {
		host, port, err := net.SplitHostPort(b.cfg.Listen)
		if err != nil {
			return fmt.Errorf("--nats-listen %q: %w", b.cfg.Listen, err)
		}
		opts.Host = host
		if opts.Port, err = strconv.Atoi(port); err != nil {
			return fmt.Errorf("--nats-listen %q: bad port: %w", b.cfg.Listen, err)
		}
		tok, err := loadToken(filepath.Join(b.cfg.StoreDir, "token"), b.cfg.Token)
		if err != nil {
			return err
		}
		opts.Authorization = tok
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded NATS: %w", err)
	}
	b.srv = srv
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		return errors.New("embedded NATS did not become ready in 30s: check the store dir " + b.cfg.StoreDir)
	}
	b.NC, err = nats.Connect("", b.connectOpts(nats.InProcessServer(srv), nats.Token(opts.Authorization))...)
	if err != nil {
		return fmt.Errorf("connect to embedded NATS: %w", err)
	}
	return nil
}

// loadToken returns the given token, or the one stored at path, creating it.
func loadToken(path, given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(tok), 0o600); err != nil {
		return "", fmt.Errorf("write NATS token: %w", err)
	}
	return tok, nil
}

// ClientURL is the address other processes use to reach the embedded server's
// listener ("" when it does not listen).
func (b *Bus) ClientURL() string {
	if b.srv == nil || b.cfg.Listen == "" {
		return ""
	}
	return b.srv.ClientURL()
}

func (b *Bus) declare(ctx context.Context) error {
	var err error
	if b.Functions, err = b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketFuncs, Description: "torpor function versions", History: 1, Storage: jetstream.FileStorage,
	}); err != nil {
		return fmt.Errorf("declare KV %s: %w", BucketFuncs, err)
	}
	if b.Snapshots, err = b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketSnapshots, Description: "torpor start snapshots by function version", History: 1, Storage: jetstream.FileStorage,
	}); err != nil {
		return fmt.Errorf("declare KV %s: %w", BucketSnapshots, err)
	}
	if b.Workers, err = b.declareWorkers(ctx); err != nil {
		return err
	}
	if b.Calls, err = b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketCalls, Description: "torpor call records", History: 1, TTL: b.cfg.CallRetention,
		Storage: jetstream.FileStorage,
	}); err != nil {
		return fmt.Errorf("declare KV %s: %w", BucketCalls, err)
	}
	if b.Code, err = b.JS.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: BucketCode, Description: "torpor code packages by sha256", Storage: jetstream.FileStorage,
	}); err != nil {
		return fmt.Errorf("declare object store %s: %w", BucketCode, err)
	}
	if b.CallQueue, err = b.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: StreamCalls, Description: "accepted async calls and checkpointed calls to resume, removed when a worker acks them",
		Subjects: []string{SubjCalls + ">", SubjResume + ">"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute, MaxMsgSize: MaxPayload,
	}); err != nil {
		return fmt.Errorf("declare stream %s: %w", StreamCalls, err)
	}
	if _, err = b.CallQueue.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: ConsumerCalls, AckPolicy: jetstream.AckExplicitPolicy, AckWait: b.cfg.AckWait,
		MaxDeliver: -1, MaxAckPending: 10000, DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil {
		return fmt.Errorf("declare consumer %s: %w", ConsumerCalls, err)
	}
	if b.Logs, err = b.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: StreamLogs, Description: "function log lines, batched per call",
		Subjects: []string{SubjLogs + ">"}, Retention: jetstream.LimitsPolicy, MaxAge: b.cfg.CallRetention,
		MaxBytes: 1 << 30, Storage: jetstream.FileStorage, Discard: jetstream.DiscardOld,
	}); err != nil {
		return fmt.Errorf("declare stream %s: %w", StreamLogs, err)
	}
	return nil
}

// declareWorkers declares the worker directory. It lives in memory: it
// describes the processes running now. With limit markers (NATS 2.11+) a
// watcher also learns when an entry expires; an older external server
// works without them (readers then drop entries older than WorkerTTL).
func (b *Bus) declareWorkers(ctx context.Context) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: BucketWorkers, Description: "torpor worker directory: what each live worker holds",
		History: 1, TTL: WorkerTTL, LimitMarkerTTL: WorkerTTL, Storage: jetstream.MemoryStorage}
	kv, err := b.JS.CreateOrUpdateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		cfg.LimitMarkerTTL = 0
		kv, err = b.JS.CreateOrUpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("declare KV %s: %w", BucketWorkers, err)
	}
	return kv, nil
}

// Close waits (briefly) for pending async publishes, closes the connection
// and stops the embedded server.
func (b *Bus) Close() {
	if b.JS != nil {
		// Log batches are published without waiting; let them land.
		select {
		case <-b.JS.PublishAsyncComplete():
		case <-time.After(5 * time.Second):
			b.log.Warn("closing with unacknowledged log publishes")
		}
	}
	if b.NC != nil {
		_ = b.NC.Flush()
		b.NC.Close()
	}
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
	}
}

// AckWait is the async consumer's redelivery timeout.
func (b *Bus) AckWait() time.Duration { return b.cfg.AckWait }

// SnapshotSubject is the subject of snapshot requests for one worker.
func SnapshotSubject(workerID string) string {
	return SubjSnapshot + ".worker." + WorkerToken(workerID)
}

// InvokeWorkerSubject is the subject of synchronous calls of fn addressed
// to one worker; fn "*" is the worker's subscription. (Function names have
// no dots, so these never match the queue group's SubjInvoke+"*".)
func InvokeWorkerSubject(workerID, fn string) string {
	return SubjInvoke + "w." + WorkerToken(workerID) + "." + fn
}

// WorkerInfoSubject is the subject of info requests for one worker.
func WorkerInfoSubject(workerID string) string { return SubjWorkerInfo + WorkerToken(workerID) }

// WorkerKey is a worker's key in BucketWorkers.
func WorkerKey(workerID string) string { return WorkerToken(workerID) }

// WorkerToken is a worker id as one subject token (and KV key): anything
// but [A-Za-z0-9_-] is replaced by '_'.
func WorkerToken(workerID string) string {
	b := []byte(workerID)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// EvictSubject is the subject of eviction requests for one worker.
func EvictSubject(workerID string) string { return SubjEvict + WorkerToken(workerID) }
