package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// ctlListen is where an agent listens for its next control connection
// after a checkpoint: inside the instance's own /tmp, which the snapshot
// captures, so a restored instance listens there too.
const ctlListen = "/tmp/.torpor-ctl/ctl.sock"

// snapshots is the worker's snapshot state; zero when disabled.
type snapshots struct {
	svc     *snapshot.Service
	runtime string // this worker's runtime identity, checked on restore

	mu    sync.Mutex
	start map[string]string // poolKey → snapshot new instances start from
}

// EnableSnapshots lets the worker checkpoint instances with svc and start
// instances of a version from its start snapshot. Call before Start.
func (w *Worker) EnableSnapshots(ctx context.Context, svc *snapshot.Service) error {
	out, err := exec.CommandContext(ctx, w.cfg.Python, "-I", "-S", "-c",
		`import sys; print("python%d.%d.%d" % sys.version_info[:3])`).Output()
	if err != nil {
		return fmt.Errorf("worker: ask %s for its version: %w", w.cfg.Python, err)
	}
	// The path is part of the identity: the restored process maps the
	// interpreter from the very same path.
	w.snap = &snapshots{svc: svc, runtime: strings.TrimSpace(string(out)) + " at " + w.cfg.Python, start: map[string]string{}}
	return nil
}

// watchStartSnapshots mirrors the start-snapshot bucket into memory, so
// that a cold start costs no round trip to find out.
func (w *Worker) watchStartSnapshots(ctx context.Context) error {
	if w.snap == nil {
		return nil
	}
	watcher, err := w.bus.Snapshots.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("worker: watch start snapshots: %w", err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer watcher.Stop()
		for e := range watcher.Updates() {
			if e == nil {
				continue // initial values delivered
			}
			fn, ver, ok := strings.Cut(e.Key(), ".")
			if !ok {
				continue
			}
			v, _ := strconv.Atoi(ver)
			key := poolKey(fn, v)
			w.snap.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				w.snap.start[key] = string(e.Value())
			} else {
				delete(w.snap.start, key)
			}
			w.snap.mu.Unlock()
			if e.Operation() == jetstream.KeyValuePut {
				w.prefetch(ctx, string(e.Value()), fn, v)
			}
		}
	}()
	return nil
}

// prefetch fetches, verifies and unpacks a new start snapshot into the
// image cache in the background, so that the first cold start of its
// version does not wait for the download.
func (w *Worker) prefetch(ctx context.Context, id, fn string, version int) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.Now()
		err := w.snap.svc.Prefetch(ctx, id, snapshot.Expect{Function: fn, Version: version, Runtime: w.snap.runtime})
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("prefetch of start snapshot failed; its first restore will fetch it", "snapshot", id, "fn", fn, "version", version, "err", err)
			}
			return
		}
		w.log.Debug("start snapshot prefetched", "snapshot", id, "fn", fn, "version", version, "took", time.Since(t))
	}()
}

func startKey(fn string, version int) string { return fn + "." + strconv.Itoa(version) }

// startSnapshot is the snapshot new instances of ver start from, or "".
func (w *Worker) startSnapshot(ver function.Version) string {
	if w.snap == nil {
		return ""
	}
	w.snap.mu.Lock()
	defer w.snap.mu.Unlock()
	return w.snap.start[poolKey(ver.Name, ver.Version)]
}

// HasStartSnapshot reports whether new instances of fn version start from
// a snapshot on this worker.
func (w *Worker) HasStartSnapshot(fn string, version int) bool {
	return w.startSnapshot(function.Version{Spec: function.Spec{Name: fn}, Version: version}) != ""
}

// errNoSnapshots is returned when the worker has no snapshot engine.
func (w *Worker) errNoSnapshots() error {
	return fmt.Errorf("worker %s cannot take or restore snapshots (no usable CRIU: run scripts/install-criu.sh, then `torpor doctor`): %w",
		w.cfg.ID, errdefs.ErrUnavailable)
}

// Snapshot checkpoints an idle instance of req.Function into the snapshot
// store (starting one if none is idle).
func (w *Worker) Snapshot(ctx context.Context, req api.SnapshotCreate) (api.SnapshotCreated, error) {
	if w.snap == nil {
		return api.SnapshotCreated{}, w.errNoSnapshots()
	}
	// As for calls: a version committed elsewhere shows up here within
	// moments; a function that does not exist fails fast.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ver, err := w.reg.ResolveWait(rctx, req.Function, req.Version)
	cancel()
	if err != nil {
		return api.SnapshotCreated{}, err
	}
	in, err := w.takeForSnapshot(ctx, ver, req.Instance, req.Call)
	if err != nil {
		return api.SnapshotCreated{}, err
	}
	res := api.SnapshotCreated{Function: ver.Name, Version: ver.Version, Instance: in.id, Worker: w.cfg.ID}
	ready, err := in.cl.PrepareCheckpoint(ctx, ctlListen, !req.NoGC, nil)
	if err != nil {
		if errors.Is(err, agentproto.ErrUnusable) || errors.Is(err, agentproto.ErrAgentExited) || errors.Is(err, agentproto.ErrProtocol) || ctx.Err() != nil {
			w.retire(in)
		} else {
			w.release(in)
		}
		return res, fmt.Errorf("snapshot of %s: %w", in.id, err)
	}
	res.RSSBefore, res.RSSAfter, res.GCNanos = ready.RSSBefore, ready.RSSAfter, int64(ready.GC)
	cspec, labels := w.sandboxes.CheckpointSpec(in.sb, in.spec, req.LeaveRunning)
	sres, err := w.snap.svc.Checkpoint(ctx, cspec, snapshot.Meta{Function: ver.Name, Version: ver.Version, Runtime: w.snap.runtime,
		MemoryBytes: ready.RSSAfter, Labels: labels})
	if err == nil {
		res.ID, res.DumpNanos, res.WallNanos = sres.ID, int64(sres.Checkpoint.Duration), int64(sres.Wall)
		res.RawBytes, res.StoredBytes = sres.Image.RawBytes, sres.Image.CompressedBytes
	}
	if req.LeaveRunning || err != nil {
		// The instance is still running (a failed dump lets it go): it
		// waits for its new control connection.
		if rerr := w.reconnectIdle(ctx, in); rerr != nil {
			w.log.Warn("instance lost after checkpoint", "instance", in.id, "fn", ver.Name, "err", rerr)
			w.retire(in)
		} else {
			w.release(in)
		}
	} else {
		w.retire(in) // CRIU killed it after the dump
	}
	if err != nil {
		return res, err
	}
	if req.Use {
		if _, err := w.bus.Snapshots.Put(ctx, startKey(ver.Name, ver.Version), []byte(res.ID)); err != nil {
			return res, fmt.Errorf("snapshot %s stored, but making it the start snapshot failed: %w", res.ID, err)
		}
		res.Used = true
	}
	return res, nil
}

// takeForSnapshot takes an idle instance of ver out of the pool — the one
// named by id, or the one that served call, or any — or, when neither is
// named, starts a new one.
func (w *Worker) takeForSnapshot(ctx context.Context, ver function.Version, id, call string) (*instance, error) {
	if call != "" {
		if v, ok := w.running.Load(call); ok {
			return nil, fmt.Errorf("call %s is still running on instance %s: a snapshot of a running call would start every instance in the middle of it; snapshot it when it is over (running calls move between workers on their own, see docs/migration.md): %w",
				call, v.(*runningCall).in.id, errdefs.ErrConflict)
		}
	}
	w.mu.Lock()
	for _, in := range w.idle[poolKey(ver.Name, ver.Version)] {
		if (id == "" || in.id == id) && (call == "" || in.lastCall == call) {
			if in.tmpl != nil && (id != "" || call != "") {
				w.mu.Unlock()
				return nil, fmt.Errorf("instance %s was forked from its function template and shares the template's PID namespace, "+
					"so it cannot be checkpointed on its own: snapshot the function instead (torpor snapshot create %s), "+
					"or run the worker with --templates=false: %w", in.id, ver.Name, errdefs.ErrConflict)
			}
			if in.tmpl != nil {
				continue // a new instance of its own is started below
			}
			w.removeIdleLocked(in)
			w.mu.Unlock()
			w.metrics.instances.WithLabelValues("idle").Dec()
			return in, nil
		}
	}
	w.mu.Unlock()
	if id != "" {
		return nil, errdefs.NotFound(fmt.Sprintf("instance %s of %s v%d is not idle on worker %s (busy instances cannot be checkpointed yet)", id, ver.Name, ver.Version, w.cfg.ID))
	}
	if call != "" {
		return nil, errdefs.NotFound(fmt.Sprintf("the instance that served call %s is no longer idle on worker %s (it has served other calls since, is serving one, or was stopped)", call, w.cfg.ID))
	}
	if err := w.reserve(ctx, ver.MemoryMB, w.cfg.QueueWait); err != nil {
		return nil, err
	}
	in, err := w.spawn(ctx, ver)
	if err != nil {
		w.unreserve(ver.MemoryMB)
		return nil, err
	}
	return in, nil
}

// reconnectIdle reconnects an idle instance left running after a dump.
func (w *Worker) reconnectIdle(ctx context.Context, in *instance) error {
	_, err := w.reconnect(ctx, in, false)
	return err
}

// reconnect connects to the control socket an instance's agent listens on
// after a checkpoint, and tells it whether it was restored.
func (w *Worker) reconnect(ctx context.Context, in *instance, restored bool) (agentproto.Resumed, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.InitTimeout)
	defer cancel()
	path := "/proc/" + strconv.Itoa(in.sb.Pid()) + "/root" + ctlListen
	var d net.Dialer
	var conn net.Conn
	var err error
	for {
		conn, err = d.DialContext(ctx, "unix", path)
		if err == nil {
			break
		}
		select {
		case <-in.sb.Done():
			return agentproto.Resumed{}, fmt.Errorf("instance exited before it could be reconnected: %w", err)
		case <-ctx.Done():
			return agentproto.Resumed{}, fmt.Errorf("connect to %s: %w", path, err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cl := agentproto.NewClient(conn)
	resumed, err := cl.AfterRestore(ctx, restored)
	if err != nil {
		_ = cl.Close()
		return resumed, err
	}
	in.cl = cl
	return resumed, nil
}

// restore starts an instance of ver from snapshot id (the restore path);
// the caller has reserved its memory.
func (w *Worker) restore(ctx context.Context, ver function.Version, id string) (*instance, error) {
	in, resumed, err := w.restoreInstance(ctx, ver, id)
	if err == nil && resumed.InCall != "" {
		w.retire(in)
		return nil, fmt.Errorf("snapshot %s was taken in the middle of call %s: it resumes that call, it cannot start new ones: %w",
			id, resumed.InCall, errdefs.ErrInvalid)
	}
	return in, err
}

// restoreInstance restores snapshot id as a live instance of ver and
// reports what its agent says on reconnection (the call it was running,
// for a call's own checkpoint).
func (w *Worker) restoreInstance(ctx context.Context, ver function.Version, id string) (*instance, agentproto.Resumed, error) {
	codeDir, err := w.codeDir(ctx, ver)
	if err != nil {
		return nil, agentproto.Resumed{}, err
	}
	spec := w.instanceSpec(ver, newInstanceID(), codeDir)
	var rres snapshot.RestoreResult
	sb, err := w.sandboxes.Restore(ctx, spec, func(ctx context.Context, env sandbox.RestoreEnv) (int, error) {
		var err error
		rres, err = w.snap.svc.Restore(ctx, id, snapshot.Expect{Function: ver.Name, Version: ver.Version, Runtime: w.snap.runtime}, snapshot.RestoreSpec{
			Root: env.Root, Mounts: env.Mounts, ExecPrefix: env.ExecPrefix,
		})
		return rres.Restore.Pid, err
	})
	if err != nil {
		return nil, agentproto.Resumed{}, err
	}
	in := &instance{id: spec.ID, ver: ver, sb: sb, spec: spec}
	resumed, err := w.reconnect(ctx, in, true)
	if err != nil {
		w.destroy(in)
		return nil, resumed, fmt.Errorf("restored instance of %s did not answer: %w", ver.Name, err)
	}
	w.metrics.instances.WithLabelValues("live").Inc()
	return in, resumed, nil
}
