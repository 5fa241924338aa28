package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// maxDeployBody bounds a deploy request: the largest code zip in base64
// plus room for the spec.
const maxDeployBody = function.MaxCodeZipBytes*4/3 + 64<<10

func (s *Server) handleDeploy(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := decodeDeploy(w, r, name)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	v, err := s.b.Deploy(r.Context(), req.Spec, req.CodeZip)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "function deployed",
		slog.String("fn", v.Name), slog.Int("version", v.Version), slog.String("code_sha256", v.CodeDigest))
	status := http.StatusOK
	if v.Version == 1 {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/functions/"+v.Name)
	}
	writeJSON(w, status, v)
}

// decodeDeploy reads and checks a deploy body. The spec is normalized here
// so that a bad spec is rejected before the code travels any further; the
// zip itself is the backend's to validate.
func decodeDeploy(w http.ResponseWriter, r *http.Request, name string) (api.DeployRequest, error) {
	var req api.DeployRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDeployBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("unexpected data after the JSON object")
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, errdefs.TooLarge(fmt.Sprintf("deploy request over %d bytes: the code zip may be at most %d MB", int64(maxDeployBody), function.MaxCodeZipBytes>>20))
		}
		return req, errdefs.Invalid("invalid deploy request: " + err.Error() +
			`: send {"runtime","handler","memory_mb","timeout_s","env","concurrency","max_duration_s","code_zip":"<base64 zip>"}`)
	}
	if req.Name != "" && req.Name != name {
		return req, errdefs.Invalid(fmt.Sprintf("the body names function %q but the path names %q: drop name from the body or make them equal", req.Name, name))
	}
	req.Name = name
	if len(req.CodeZip) == 0 {
		return req, errdefs.Invalid("code_zip is missing: send the function's code as a base64-encoded zip")
	}
	if len(req.CodeZip) > function.MaxCodeZipBytes {
		return req, errdefs.TooLarge(fmt.Sprintf("code zip is %d bytes: the limit is %d MB", len(req.CodeZip), function.MaxCodeZipBytes>>20))
	}
	if err := req.Spec.Normalize(); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Server) handleGetFunction(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	if err == nil {
		var version int
		version, err = queryVersion(r, "version")
		if err == nil {
			var v function.Version
			if v, err = s.b.Function(r.Context(), name, version); err == nil {
				writeJSON(w, http.StatusOK, v)
				return
			}
		}
	}
	s.fail(w, r, err, slog.String("fn", name))
}

func (s *Server) handleListFunctions(w http.ResponseWriter, r *http.Request) {
	fns, err := s.b.Functions(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if fns == nil {
		fns = []function.Version{}
	}
	writeJSON(w, http.StatusOK, api.FunctionList{Functions: fns})
}

func (s *Server) handleDeleteFunction(w http.ResponseWriter, r *http.Request) {
	name, err := pathName(r)
	if err == nil {
		err = s.b.DeleteFunction(r.Context(), name)
	}
	if err != nil {
		s.fail(w, r, err, slog.String("fn", name))
		return
	}
	s.metrics.forget(name)
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "function deleted", slog.String("fn", name))
	w.WriteHeader(http.StatusNoContent)
}

// pathName returns the {name} path wildcard if it is a legal function name.
func pathName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	return name, function.ValidateName(name)
}

// queryVersion parses an optional version query parameter; 0 means latest.
func queryVersion(r *http.Request, key string) (int, error) {
	q := r.URL.Query().Get(key)
	if q == "" {
		return 0, nil
	}
	v, err := strconv.Atoi(q)
	if err != nil || v < 1 {
		return 0, errdefs.Invalid(fmt.Sprintf("invalid %s %q: use a version number (1, 2, ...) or omit it for the latest", key, q))
	}
	return v, nil
}
