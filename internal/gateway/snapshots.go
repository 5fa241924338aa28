package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Snapshots is what the /v1/snapshots routes need. Without one (nil in
// Options) they answer 503.
type Snapshots interface {
	List(ctx context.Context) ([]api.Snapshot, error)
	Get(ctx context.Context, ref string) (api.Snapshot, error)
	Delete(ctx context.Context, ref string) (string, error)
	Create(ctx context.Context, req api.SnapshotCreate) (api.SnapshotCreated, error)
	// Export resolves ref and returns its bundle's size and a function
	// that writes the bundle.
	Export(ctx context.Context, ref string) (id string, size int64, write func(io.Writer) error, err error)
	// Import verifies and stores a bundle.
	Import(ctx context.Context, r io.Reader) (api.Snapshot, error)
	// GC removes unreferenced data objects older than olderThan.
	GC(ctx context.Context, olderThan time.Duration) ([]string, error)
}

func (s *Server) snapshots() (Snapshots, error) {
	if s.snaps == nil {
		return nil, fmt.Errorf("this gateway has no snapshot store configured (--snapshot-store): %w", errdefs.ErrUnavailable)
	}
	return s.snaps, nil
}

func (s *Server) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	sn, err := s.snapshots()
	var list []api.Snapshot
	if err == nil {
		list, err = sn.List(r.Context())
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list == nil {
		list = []api.Snapshot{}
	}
	writeJSON(w, http.StatusOK, api.SnapshotList{Snapshots: list})
}

func (s *Server) handleGetSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	sn, err := s.snapshots()
	var snap api.Snapshot
	if err == nil {
		snap, err = sn.Get(r.Context(), ref)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("snapshot", ref))
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	sn, err := s.snapshots()
	if err == nil {
		_, err = sn.Delete(r.Context(), ref)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("snapshot", ref))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.snapshots()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req api.SnapshotCreate
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		s.fail(w, r, errdefs.Invalid("malformed snapshot request: "+err.Error()+` (want {"function": NAME, ...})`))
		return
	}
	res, err := sn.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", req.Function))
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

func (s *Server) handleExportSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	sn, err := s.snapshots()
	var (
		id    string
		size  int64
		write func(io.Writer) error
	)
	if err == nil {
		id, size, write, err = sn.Export(r.Context(), ref)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("snapshot", ref))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("X-Torpor-Snapshot", id)
	w.WriteHeader(http.StatusOK)
	if err := write(w); err != nil {
		// Too late for a status: the client sees a short body.
		s.log.Warn("snapshot export broken off", "snapshot", id, "err", err)
	}
}

func (s *Server) handleImportSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.snapshots()
	var snap api.Snapshot
	if err == nil {
		snap, err = sn.Import(r.Context(), r.Body)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

func (s *Server) handleGCSnapshots(w http.ResponseWriter, r *http.Request) {
	sn, err := s.snapshots()
	olderThan := time.Hour
	if err == nil {
		if q := r.URL.Query().Get("older_than"); q != "" {
			if olderThan, err = time.ParseDuration(q); err != nil {
				err = errdefs.Invalid(fmt.Sprintf("older_than %q: want a duration such as 1h or 30m", q))
			}
		}
	}
	var removed []string
	if err == nil {
		removed, err = sn.GC(r.Context(), olderThan)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SnapshotGC{Removed: removed})
}
