package app_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/dispatch"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/internal/worker"
)

// node is one worker with its own home, sharing a bus and a snapshot
// store with the other nodes of a test.
type node struct {
	w   *worker.Worker
	d   *dispatch.Dispatcher
	dir *dispatch.Directory // this node's view of the worker directory
}

// nodeOption adjusts a node's worker and sandbox configuration.
type nodeOption func(*worker.Config, *sandbox.Config)

// newNode starts a worker with snapshots to store (none when store is nil).
func newNode(t *testing.T, b *bus.Bus, store blob.Store, keys *image.Keyring, id string, opts ...nodeOption) node {
	t.Helper()
	log := testenv.Logger(t).With("node", id)
	py, err := config.ResolvePython(testenv.Ctx(t), testenv.Python(t))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	runCtx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg, err := registry.New(runCtx, b.Functions, b.Code, log)
	if err != nil {
		t.Fatal(err)
	}
	calls := callstore.New(b.Calls)
	wcfg := worker.Config{ID: id, Home: home, Python: py.Path, PythonHome: py.Prefix}
	scfg := sandbox.Config{StateDir: filepath.Join(home, "sandbox"), CgroupName: testCgroupName()}
	for _, o := range opts {
		o(&wcfg, &scfg)
	}
	sbm, err := sandbox.NewManager(testenv.Ctx(t), scfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = sbm.Close(ctx)
	})
	w, err := worker.New(testenv.Ctx(t), wcfg, b, reg, calls, sbm, worker.NewMetrics(prometheus.NewRegistry()), log)
	if err != nil {
		t.Fatal(err)
	}
	if store != nil {
		e := testenv.CRIU(t)
		svc, err := snapshot.NewService(e, store, keys, snapshot.ServiceConfig{EngineVersion: e.Version()}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Close() })
		if err := w.EnableSnapshots(testenv.Ctx(t), svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w.Close(ctx)
	})
	dir, err := dispatch.NewDirectory(runCtx, b, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	return node{w: w, d: dispatch.New(b, reg, calls, w, dir, log), dir: dir}
}

// cluster is what the nodes of a snapshot test share: a bus, a snapshot
// store and the cluster key.
type cluster struct {
	bus   *bus.Bus
	store blob.Store
	keys  *image.Keyring
}

// newCluster skips (or, in CI, fails) without root, Python or CRIU, and
// returns a cluster over store (a fresh local directory when nil).
func newCluster(t *testing.T, store blob.Store) cluster {
	t.Helper()
	requireRoot(t)
	testenv.Python(t)
	testenv.CRIU(t)
	if store == nil {
		st, err := localdir.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		store = st
	}
	keys, err := image.LoadOrCreateKey(filepath.Join(t.TempDir(), "cluster-key"))
	if err != nil {
		t.Fatal(err)
	}
	return cluster{bus: testenv.Bus(t), store: store, keys: keys}
}

// node starts a worker of the cluster.
func (c cluster) node(t *testing.T, id string) node { return newNode(t, c.bus, c.store, c.keys, id) }

// deploy deploys app.py = code as fn with memoryMB.
func (n node) deploy(t *testing.T, fn, code string, memoryMB int) {
	t.Helper()
	zip, err := codezip.FromFiles(map[string]string{"app.py": code})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Deploy(testenv.Ctx(t), function.Spec{Name: fn, Runtime: "python3", Handler: "app.handler", MemoryMB: memoryMB, TimeoutSec: 5}, zip); err != nil {
		t.Fatal(err)
	}
}

// statefulCode counts calls in a global, keeps a file in /tmp and draws
// random numbers: all three must survive a snapshot, and the RNG must be
// reseeded in every restored copy.
const statefulCode = `import gc, os, random
gc.disable()  # let cyclic garbage pile up, for the GC before a dump to free
class Node:
    pass
n = 0
def handler(event, context):
    global n
    n += 1
    if event.get("garbage"):
        for _ in range(event["garbage"]):
            a = Node()
            a.self = a  # a cycle: freed only by the GC
            a.pad = "x" * 200
    if event.get("tmp"):
        with open("/tmp/state", "w") as f:
            f.write(event["tmp"])
    t = open("/tmp/state").read() if os.path.exists("/tmp/state") else ""
    lo = False
    if event.get("lo"):  # loopback works (after a restore too)
        import socket
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        c = socket.create_connection(srv.getsockname())
        lo = srv.accept()[0] is not None
        c.close()
        srv.close()
    return {"n": n, "tmp": t, "pid": os.getpid(), "r": random.random(), "lo": lo}
`

type stateful struct {
	N   int     `json:"n"`
	Tmp string  `json:"tmp"`
	Pid int     `json:"pid"`
	R   float64 `json:"r"`
	Lo  bool    `json:"lo"`
}

func invokeStateful(t *testing.T, n node, fn string, event string) (stateful, function.InvokeResult) {
	t.Helper()
	res, err := n.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: fn, Payload: []byte(event)})
	if err != nil {
		t.Fatalf("invoke: %v", err)
	}
	if res.Err != nil {
		t.Fatalf("invoke: function error %+v", res.Err)
	}
	var s stateful
	if err := json.Unmarshal(res.Payload, &s); err != nil {
		t.Fatalf("result %q: %v", res.Payload, err)
	}
	return s, res
}

// TestSnapshotRestoreAcrossWorkers checkpoints a Python instance on one
// worker and restores it on another (another home, another process tree,
// the same pids inside the instance), through a shared local directory and
// through S3 (a real MinIO).
func TestSnapshotRestoreAcrossWorkers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) blob.Store
	}{
		{"localdir", func(t *testing.T) blob.Store {
			st, err := localdir.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return st
		}},
		{"s3", func(t *testing.T) blob.Store {
			srv := testenv.MinIO(t)
			st, err := s3store.New(testenv.Ctx(t), s3store.Config{Endpoint: srv.Endpoint, Bucket: "snapshots",
				AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PathStyle: true})
			if err == nil {
				err = st.EnsureBucket(testenv.Ctx(t))
			}
			if err != nil {
				t.Fatal(err)
			}
			return st
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireRoot(t) // before a MinIO is started for nothing
			testRestoreAcrossWorkers(t, newCluster(t, tc.store(t)))
		})
	}
}

func testRestoreAcrossWorkers(t *testing.T, c cluster) {
	a := c.node(t, "w-a")
	a.deploy(t, "counter", statefulCode, 128)
	s1, _ := invokeStateful(t, a, "counter", `{"tmp":"kept","garbage":100000}`)
	s2, _ := invokeStateful(t, a, "counter", `{}`)
	if s2.N != s1.N+1 {
		t.Fatalf("instance not reused: %+v then %+v", s1, s2)
	}

	// Checkpoint, leaving the instance running: it keeps serving on a-.
	res, err := a.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "counter", LeaveRunning: true})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Logf("snapshot %s: rss %d -> %d after GC, raw %d B, stored %d B, dump %v, wall %v",
		res.ID[:19], res.RSSBefore, res.RSSAfter, res.RawBytes, res.StoredBytes, time.Duration(res.DumpNanos), time.Duration(res.WallNanos))
	if res.RSSAfter > res.RSSBefore-5<<20 {
		t.Errorf("the GC before the dump freed less than 5 MB of cyclic garbage: rss %d -> %d", res.RSSBefore, res.RSSAfter)
	}
	s3, _ := invokeStateful(t, a, "counter", `{}`)
	if s3.N != s2.N+1 {
		t.Fatalf("instance left running lost its state: %+v after %+v", s3, s2)
	}

	// Stop the first worker (its instance goes with it), make the snapshot
	// the start snapshot and restore it on a second worker.
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	a.w.Close(closeCtx)
	cancel()
	if _, err := c.bus.Snapshots.Put(testenv.Ctx(t), "counter.1", []byte(res.ID)); err != nil {
		t.Fatal(err)
	}
	wc := c.node(t, "w-c")
	testenv.Eventually(t, 5*time.Second, "start snapshot visible", func() bool { return wc.w.HasStartSnapshot("counter", 1) })
	var got []stateful
	for range 2 {
		s, r := invokeStateful(t, wc, "counter", `{"lo":true}`)
		got = append(got, s)
		t.Logf("on w-c: %+v start=%s start_time=%v", s, r.Start, r.StartTime)
		if len(got) == 1 && r.Start != function.StartRestore {
			t.Errorf("first call on w-c started %q, want %q", r.Start, function.StartRestore)
		}
	}
	// The restored copy continues from the snapshot: n, /tmp and the pid
	// inside its namespace are the checkpointed instance's.
	if got[0].N != s2.N+1 || got[0].Tmp != "kept" || got[0].Pid != s2.Pid || !got[0].Lo {
		t.Errorf("restored state %+v, want n=%d tmp=kept pid=%d lo=true", got[0], s2.N+1, s2.Pid)
	}
	if got[1].N != got[0].N+1 {
		t.Errorf("restored instance not reused: %+v", got)
	}
	// Reseeded: the original drew s3.R as its next number; the copy must not.
	if got[0].R == s3.R {
		t.Errorf("restored instance drew the same random number as the original (%v): RNG not reseeded", got[0].R)
	}
}

// TestRefusedSnapshotStartsCold: a start snapshot whose data was tampered
// with is refused before CRIU sees it, and the call starts cold instead.
func TestRefusedSnapshotStartsCold(t *testing.T) {
	root := t.TempDir()
	store, err := localdir.New(root)
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, store)
	n := c.node(t, "w-a")
	n.deploy(t, "counter", statefulCode, 128)
	invokeStateful(t, n, "counter", `{"tmp":"x"}`)
	// Snapshot and stop the only instance (not left running).
	res, err := n.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	// Flip one byte in the middle of the data object — before the snapshot
	// becomes the start snapshot, which workers prefetch (and verify).
	sums, err := image.List(testenv.Ctx(t), c.store)
	if err != nil || len(sums) != 1 {
		t.Fatalf("List = %v, %v", sums, err)
	}
	data := filepath.Join(root, filepath.FromSlash(sums[0].Manifest.DataKey))
	raw, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0xff
	if err := os.WriteFile(data, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.bus.Snapshots.Put(testenv.Ctx(t), "counter.1", []byte(res.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "start snapshot visible", func() bool { return n.w.HasStartSnapshot("counter", 1) })
	s, r := invokeStateful(t, n, "counter", `{}`)
	if r.Start != function.StartCold || s.N != 1 || s.Tmp != "" {
		t.Errorf("with snapshot %s corrupt: start=%s state=%+v, want a cold start with fresh state", res.ID[:19], r.Start, s)
	}
}

// TestSnapshotWithListeningSocket: an instance holding a TCP listener on
// loopback is restored with its network namespace whole, and the listener
// still accepts.
func TestSnapshotWithListeningSocket(t *testing.T) {
	c := newCluster(t, nil)
	n := c.node(t, "w-a")
	n.deploy(t, "listener", `import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
def handler(event, context):
    c = socket.create_connection(srv.getsockname())
    a, _ = srv.accept()
    c.sendall(b"ping")
    got = a.recv(4)
    a.close()
    c.close()
    return got.decode()
`, 128)
	if _, err := n.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "listener", Use: true}); err != nil {
		t.Fatal(err)
	}
	sums, err := image.List(testenv.Ctx(t), c.store)
	if err != nil || len(sums) != 1 || sums[0].Manifest.Labels[snapshot.LabelNoInetSockets] != "" {
		t.Fatalf("the snapshot of an instance with a listener is labelled %v (%v)", sums, err)
	}
	testenv.Eventually(t, 5*time.Second, "start snapshot visible", func() bool { return n.w.HasStartSnapshot("listener", 1) })
	res, err := n.d.Invoke(testenv.Ctx(t), function.InvokeRequest{Function: "listener", Payload: []byte("{}")})
	if err != nil || res.Err != nil || string(res.Payload) != `"ping"` || res.Start != function.StartRestore {
		t.Fatalf("call on the restored listener: %+v, %v", res, err)
	}
}

// TestRuntimeAssistedCapture: the GC and allocator trim the agent runs
// before a dump (CheckSync's idea) keep freed memory out of the image.
func TestRuntimeAssistedCapture(t *testing.T) {
	n := newCluster(t, nil).node(t, "w-a")
	n.deploy(t, "counter", statefulCode, 256)
	// ~16 MB of cyclic garbage, which only the GC frees.
	invokeStateful(t, n, "counter", `{"garbage":200000}`)
	var raw [2]int64
	for i, noGC := range []bool{true, false} {
		res, err := n.w.Snapshot(testenv.Ctx(t), api.SnapshotCreate{Function: "counter", LeaveRunning: true, NoGC: noGC})
		if err != nil {
			t.Fatal(err)
		}
		raw[i] = res.RawBytes
		t.Logf("no_gc=%v: rss %.1f -> %.1f MB, image %.1f MB raw, %.1f MB stored", noGC,
			float64(res.RSSBefore)/(1<<20), float64(res.RSSAfter)/(1<<20), float64(res.RawBytes)/(1<<20), float64(res.StoredBytes)/(1<<20))
	}
	if raw[1] > raw[0]/2 {
		t.Errorf("image with GC %d bytes, without %d: want less than half", raw[1], raw[0])
	}
}
