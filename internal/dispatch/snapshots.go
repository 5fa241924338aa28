package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
)

// Snapshots serves the snapshot routes: listing, inspecting and deleting
// straight from the snapshot store, and taking snapshots through a worker.
type Snapshots struct {
	bus   *bus.Bus
	reg   *registry.Registry
	calls *callstore.Store // to find the worker of a call
	store blob.Store
	keys  *image.Keyring // verifies imports
}

// NewSnapshots returns the snapshot backend over store; keys verifies
// imported bundles.
func NewSnapshots(b *bus.Bus, reg *registry.Registry, calls *callstore.Store, store blob.Store, keys *image.Keyring) *Snapshots {
	return &Snapshots{bus: b, reg: reg, calls: calls, store: store, keys: keys}
}

// Export resolves ref and returns the size of its bundle and its writer.
func (s *Snapshots) Export(ctx context.Context, ref string) (string, int64, func(io.Writer) error, error) {
	id, err := image.Resolve(ctx, s.store, ref)
	if err != nil {
		return "", 0, nil, err
	}
	size, err := image.BundleSize(ctx, s.store, id)
	if err != nil {
		return "", 0, nil, err
	}
	return id, size, func(w io.Writer) error { return image.Export(ctx, s.store, id, w) }, nil
}

// Import verifies a bundle with the cluster key and stores it.
func (s *Snapshots) Import(ctx context.Context, r io.Reader) (api.Snapshot, error) {
	id, m, err := image.Import(ctx, s.store, s.keys, r)
	if err != nil {
		return api.Snapshot{}, err
	}
	return toAPI(id, m), nil
}

// inUse maps snapshot ID → the function versions that start from it.
func (s *Snapshots) inUse(ctx context.Context) (map[string][]string, error) {
	keys, err := s.bus.Snapshots.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list start snapshots: %w", err)
	}
	out := map[string][]string{}
	for k := range keys.Keys() {
		e, err := s.bus.Snapshots.Get(ctx, k)
		if err != nil {
			continue
		}
		fn, ver, _ := strings.Cut(k, ".")
		id := string(e.Value())
		out[id] = append(out[id], fn+"@"+ver)
	}
	return out, nil
}

func toAPI(id string, m image.Manifest) api.Snapshot {
	return api.Snapshot{
		ID: id, Function: m.Function, FunctionVersion: m.FunctionVersion, Runtime: m.Runtime,
		CRIUVersion: m.CRIUVersion, Kernel: m.Kernel, Arch: m.Arch, CreatedAt: m.CreatedAt.UTC().Format(time.RFC3339),
		Compression: string(m.Compression), StoredBytes: m.DataSize, RawBytes: m.RawSize, MemoryBytes: m.MemoryBytes, KeyID: m.KeyID,
	}
}

// List returns every stored snapshot, newest first.
func (s *Snapshots) List(ctx context.Context) ([]api.Snapshot, error) {
	sums, err := image.List(ctx, s.store)
	if err != nil {
		return nil, err
	}
	use, err := s.inUse(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Snapshot, 0, len(sums))
	for _, sum := range sums {
		a := api.Snapshot{ID: sum.ID, Error: sum.Err}
		if sum.Err == "" {
			a = toAPI(sum.ID, sum.Manifest)
		}
		a.InUse = use[sum.ID]
		out = append(out, a)
	}
	slices.SortStableFunc(out, func(a, b api.Snapshot) int { return strings.Compare(b.CreatedAt, a.CreatedAt) })
	return out, nil
}

// Get describes the snapshot ref (an ID or a unique prefix of its hex).
func (s *Snapshots) Get(ctx context.Context, ref string) (api.Snapshot, error) {
	id, err := image.Resolve(ctx, s.store, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	m, err := image.Stat(ctx, s.store, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	a := toAPI(id, m)
	for _, f := range m.Files {
		a.Files = append(a.Files, api.SnapshotFile{Name: f.Name, Size: f.Size})
	}
	use, err := s.inUse(ctx)
	if err != nil {
		return api.Snapshot{}, err
	}
	a.InUse = use[id]
	return a, nil
}

// Delete removes the snapshot ref, and stops versions starting from it.
func (s *Snapshots) Delete(ctx context.Context, ref string) (string, error) {
	id, err := image.Resolve(ctx, s.store, ref)
	if err != nil {
		return "", err
	}
	use, err := s.inUse(ctx)
	if err != nil {
		return "", err
	}
	for _, fv := range use[id] {
		fn, ver, _ := strings.Cut(fv, "@")
		if err := s.bus.Snapshots.Delete(ctx, fn+"."+ver); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return "", fmt.Errorf("stop %s starting from %s: %w", fv, id, err)
		}
	}
	return id, image.Delete(ctx, s.store, id)
}

// Create asks a worker to snapshot an instance.
func (s *Snapshots) Create(ctx context.Context, req api.SnapshotCreate) (api.SnapshotCreated, error) {
	subject := bus.SubjSnapshot
	if req.Worker != "" {
		subject = bus.SnapshotSubject(req.Worker)
	}
	if req.Call != "" {
		c, err := s.callRecord(ctx, req.Call)
		if err != nil {
			return api.SnapshotCreated{}, err
		}
		if req.Function != "" && (req.Function != c.Function || req.Version != 0 && req.Version != c.Version) {
			return api.SnapshotCreated{}, errdefs.Invalid(fmt.Sprintf("call %s is a call of %s v%d, not of %s", req.Call, c.Function, c.Version, req.Function))
		}
		if len(c.Attempts) == 0 {
			return api.SnapshotCreated{}, fmt.Errorf("call %s has not started on any worker yet: %w", req.Call, errdefs.ErrConflict)
		}
		req.Function, req.Version = c.Function, c.Version
		subject = bus.SnapshotSubject(c.Attempts[len(c.Attempts)-1].Worker)
	}
	if err := function.ValidateName(req.Function); err != nil {
		return api.SnapshotCreated{}, err
	}
	if req.Version < 0 {
		return api.SnapshotCreated{}, errdefs.Invalid("version " + strconv.Itoa(req.Version) + " is negative")
	}
	// A function that does not exist is this gateway's answer, as for
	// calls, not a worker's (which would first wait for it to show up).
	if _, err := s.reg.Resolve(req.Function, req.Version); err != nil {
		return api.SnapshotCreated{}, err
	}
	body, _ := json.Marshal(req)
	msg := nats.NewMsg(subject)
	msg.Data = body
	ctx, cancelReq := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelReq()
	reply, err := s.bus.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			if subject != bus.SubjSnapshot {
				return api.SnapshotCreated{}, fmt.Errorf("snapshot %s: the worker %s is gone or cannot take snapshots: %w", req.Function, strings.TrimPrefix(subject, bus.SubjSnapshot+".worker."), errdefs.ErrUnavailable)
			}
			return api.SnapshotCreated{}, fmt.Errorf("snapshot %s: no worker can take snapshots (is CRIU installed? see `torpor doctor`): %w", req.Function, errdefs.ErrUnavailable)
		}
		return api.SnapshotCreated{}, requestError("snapshot "+req.Function, err)
	}
	res, err := callmsg.ParseReply(reply)
	if err != nil {
		return api.SnapshotCreated{}, fmt.Errorf("snapshot %s: %w", req.Function, err)
	}
	var out api.SnapshotCreated
	if err := json.Unmarshal(res.Payload, &out); err != nil {
		return api.SnapshotCreated{}, fmt.Errorf("snapshot %s: bad worker reply: %w", req.Function, err)
	}
	return out, nil
}

// GC removes the data objects no snapshot refers to (left by uploads that
// died half way) that are older than olderThan, and returns their keys.
func (s *Snapshots) GC(ctx context.Context, olderThan time.Duration) ([]string, error) {
	if olderThan < time.Minute {
		return nil, errdefs.Invalid(fmt.Sprintf("older_than %s is too short: an upload in progress has no manifest yet either; use at least 1m (default 1h)", olderThan))
	}
	removed, err := image.GC(ctx, s.store, time.Now().Add(-olderThan))
	if removed == nil {
		removed = []string{}
	}
	return removed, err
}

// callRecord reads call id's record, waiting a moment for it: a
// synchronous call's record is written just after its reply.
func (s *Snapshots) callRecord(ctx context.Context, id string) (function.Call, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		c, err := s.calls.Get(ctx, id)
		if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return c, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
