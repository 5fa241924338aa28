package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
)

// NOPResult is the restore latency of an instance that allocated nothing,
// from the local store, against cold starts of the same instance.
type NOPResult struct {
	SnapshotID    string  `json:"snapshot_id"`
	RawBytes      int64   `json:"raw_bytes"`
	StoredBytes   int64   `json:"stored_bytes"`
	Restore       Summary `json:"restore"`
	ColdStart     Summary `json:"cold_start"`
	RatioP50      float64 `json:"ratio_p50"` // restore over cold start
	RatioP99      float64 `json:"ratio_p99"`
	RestoreUS     []int64 `json:"restore_us"`      // Manager.Restore, from nothing to a running instance
	CRIURestoreUS []int64 `json:"criu_restore_us"` // of which CRIU
	// UncachedRestoreUS are the restores that downloaded, verified and
	// unpacked the image (the first; later ones find it in the worker's
	// image cache, as repeated restores on a worker do).
	UncachedRestoreUS []int64  `json:"uncached_restore_us"`
	ColdStartUS       []int64  `json:"cold_start_us"` // Manager.Start until the instance is ready
	Errors            []string `json:"errors,omitempty"`
}

// measureNOP checkpoints one NOP instance into the local store, then
// restores it n times and cold-starts it n times, alternating.
func (b *snapshotBench) measureNOP(ctx context.Context, n int) *NOPResult {
	r := &NOPResult{}
	fail := func(err error) {
		if len(r.Errors) < 5 {
			r.Errors = append(r.Errors, err.Error())
		}
	}
	svc := b.svcs[StoreLocal]
	src, err := b.startInstance(ctx, 0, DataZero)
	if err != nil {
		fail(err)
		return r
	}
	cspec, labels := b.sbm.CheckpointSpec(src.sb, src.spec, false)
	res, err := svc.Checkpoint(ctx, cspec, snapshot.Meta{Function: "bench-nop", Version: 1, Runtime: b.runtime, Labels: labels})
	b.destroy(src.sb)
	if err != nil {
		fail(fmt.Errorf("checkpoint NOP instance: %w", err))
		return r
	}
	r.SnapshotID, r.RawBytes, r.StoredBytes = res.ID, res.Image.RawBytes, res.Image.CompressedBytes
	var restoreFails, coldFails int
	var restoreTime, coldTime time.Duration
	for i := 0; i < n && ctx.Err() == nil; i++ {
		spec := b.nextSpec(0, DataZero)
		var rres snapshot.RestoreResult
		t := time.Now()
		dst, err := b.sbm.Restore(ctx, spec, func(ctx context.Context, env sandbox.RestoreEnv) (int, error) {
			var err error
			rres, err = svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: b.runtime}, snapshot.RestoreSpec{Root: env.Root, Mounts: env.Mounts, ExecPrefix: env.ExecPrefix})
			return rres.Restore.Pid, err
		})
		d := time.Since(t)
		restoreTime += d
		if err == nil {
			_, err = verifyRestored(dst, 0)
			b.destroy(dst)
		}
		if err != nil {
			restoreFails++
			fail(fmt.Errorf("restore NOP instance: %w", err))
		} else {
			r.RestoreUS = append(r.RestoreUS, d.Microseconds())
			if !rres.Cached {
				r.UncachedRestoreUS = append(r.UncachedRestoreUS, d.Microseconds())
			}
			r.CRIURestoreUS = append(r.CRIURestoreUS, rres.Restore.Duration.Microseconds())
		}

		t = time.Now()
		in, err := b.startInstance(ctx, 0, DataZero)
		d = time.Since(t)
		coldTime += d
		if err != nil {
			coldFails++
			fail(fmt.Errorf("cold start NOP instance: %w", err))
			continue
		}
		r.ColdStartUS = append(r.ColdStartUS, d.Microseconds())
		b.destroy(in.sb)
	}
	r.Restore = Summarize(r.RestoreUS, restoreFails, restoreTime)
	r.ColdStart = Summarize(r.ColdStartUS, coldFails, coldTime)
	r.RatioP50 = Ratio(r.Restore.P50US, r.ColdStart.P50US)
	r.RatioP99 = Ratio(r.Restore.P99US, r.ColdStart.P99US)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := image.Delete(dctx, svc.Store(), res.ID); err != nil && !errors.Is(err, context.Canceled) {
		b.log.Warn("delete NOP snapshot", "snapshot", res.ID, "err", err)
	}
	return r
}
