package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// callIDRE is what a call id may look like. Ids are made by the dispatcher;
// the check keeps arbitrary bytes (NATS wildcards, control characters) away
// from the backend's keys.
var callIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (s *Server) handleGetCall(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !callIDRE.MatchString(id) {
		s.fail(w, r, errdefs.Invalid(fmt.Sprintf("invalid call id %q: ids are 1-128 characters from [A-Za-z0-9._-], as in the X-Torpor-Call-Id header", id)))
		return
	}
	call, err := s.b.Call(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, slog.String("call", id))
		return
	}
	writeJSON(w, http.StatusOK, call)
}

func (s *Server) handleListCalls(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := api.DefaultCallsLimit
	if q := r.URL.Query().Get("limit"); q != "" {
		limit, err = strconv.Atoi(q)
		if err != nil || limit < 1 || limit > api.MaxCallsLimit {
			s.fail(w, r, errdefs.Invalid(fmt.Sprintf("invalid limit %q: use 1-%d", q, api.MaxCallsLimit)), slog.String("fn", name))
			return
		}
	}
	calls, err := s.b.Calls(r.Context(), name, limit)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	if calls == nil {
		calls = []function.Call{}
	}
	writeJSON(w, http.StatusOK, api.CallList{Calls: calls})
}

// handleLogs streams a function's log lines as NDJSON, one function.LogLine
// per line, flushed as each is written. The function is looked up first so
// that an unknown name is a 404 rather than an empty stream; once the 200
// is sent, a failure can only end the stream (and is logged).
func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var follow bool
	if q := r.URL.Query().Get("follow"); q != "" {
		if follow, err = strconv.ParseBool(q); err != nil {
			s.fail(w, r, errdefs.Invalid(fmt.Sprintf("invalid follow %q: use true or false", q)), slog.String("fn", name))
			return
		}
	}
	ctx := r.Context()
	if _, err := s.b.Function(ctx, name, 0); err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	// Flush the header now so a follower knows the stream is open before
	// the first line arrives. A writer that cannot flush still works.
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	err = s.b.Logs(ctx, name, follow, func(l function.LogLine) error {
		if err := enc.Encode(l); err != nil {
			return err
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.LogAttrs(ctx, slog.LevelWarn, "log stream ended by an error", slog.String("fn", name), slog.Any("err", err))
	}
}
