package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Workers is what the /v1/workers routes and DELETE
// /v1/functions/{name}/instances need. Without one (nil in Options) they
// answer 503.
type Workers interface {
	// List returns the live workers, by id.
	List(ctx context.Context) ([]api.WorkerSummary, error)
	// Info asks one worker for its processes and their memory;
	// ErrNotFound when no worker has that id.
	Info(ctx context.Context, id string) (api.WorkerInfo, error)
	// Drop stops the idle instances of a function (version 0: of every
	// version) and, unless keepTemplates, its function templates, on
	// every worker; ErrNotFound when the function or version does not exist.
	Drop(ctx context.Context, name string, version int, keepTemplates bool) (api.DropResult, error)
	// Evict asks one worker to evict itself (stop taking calls, move its
	// running calls elsewhere within the grace period, exit) and returns
	// how the eviction starts; ErrNotFound when no worker has that id,
	// ErrInvalid for a bad grace or reason.
	Evict(ctx context.Context, id string, req api.EvictRequest) (api.EvictReport, error)
}

// maxEvictBody bounds an evict request body.
const maxEvictBody = 64 << 10

func (s *Server) workers() (Workers, error) {
	if s.wks == nil {
		return nil, fmt.Errorf("this gateway has no worker directory: %w", errdefs.ErrUnavailable)
	}
	return s.wks, nil
}

func (s *Server) handleListWorkers(w http.ResponseWriter, r *http.Request) {
	wk, err := s.workers()
	var list []api.WorkerSummary
	if err == nil {
		list, err = wk.List(r.Context())
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list == nil {
		list = []api.WorkerSummary{}
	}
	writeJSON(w, http.StatusOK, api.WorkerList{Workers: list})
}

func (s *Server) handleGetWorker(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wk, err := s.workers()
	var info api.WorkerInfo
	if err == nil {
		info, err = wk.Info(r.Context(), id)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("worker", id))
		return
	}
	if info.Templates == nil {
		info.Templates = []api.ProcessInfo{}
	}
	if info.Instances == nil {
		info.Instances = []api.ProcessInfo{}
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) handleDropInstances(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	var (
		version int
		keep    bool
		res     api.DropResult
		wk      Workers
	)
	if err == nil {
		version, err = queryVersion(r, "version")
	}
	if q := r.URL.Query().Get("keep_templates"); err == nil && q != "" {
		if keep, err = strconv.ParseBool(q); err != nil {
			err = errdefs.Invalid(fmt.Sprintf("invalid keep_templates %q: use true or false", q))
		}
	}
	if err == nil {
		wk, err = s.workers()
	}
	if err == nil {
		res, err = wk.Drop(r.Context(), name, version, keep)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "instances dropped", slog.String("fn", name), slog.Int("version", version),
		slog.Bool("keep_templates", keep), slog.Int("instances", res.Instances), slog.Int("templates", res.Templates),
		slog.Int("workers", res.Workers))
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleEvictWorker(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	req, err := decodeEvict(w, r)
	var (
		wk  Workers
		rep api.EvictReport
	)
	if err == nil {
		wk, err = s.workers()
	}
	if err == nil {
		rep, err = wk.Evict(r.Context(), id, req)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("worker", id))
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "worker eviction requested", slog.String("worker", rep.Worker),
		slog.String("reason", rep.Reason), slog.Int64("grace_ms", rep.GraceMS), slog.Int("running", rep.Running))
	writeJSON(w, http.StatusAccepted, rep)
}

// decodeEvict reads an optional evict request body: none, or whitespace
// only, asks for the worker's defaults.
func decodeEvict(w http.ResponseWriter, r *http.Request) (api.EvictRequest, error) {
	var req api.EvictRequest
	const want = `: send {"grace_ms": MILLISECONDS, "reason": "TEXT"}, both optional, or no body`
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEvictBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, errdefs.Invalid(fmt.Sprintf("evict request over %d bytes%s", maxEvictBody, want))
		}
		return req, errdefs.Invalid("cannot read the evict request: " + err.Error() + want)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("unexpected data after the JSON object")
	}
	if err != nil {
		return req, errdefs.Invalid("invalid evict request: " + err.Error() + want)
	}
	return req, nil
}
