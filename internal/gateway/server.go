// Package gateway owns torpor's HTTP API: the REST API under /v1, the AWS
// Lambda invoke API (/2015-03-31/functions/{name}/invocations), /healthz and
// /metrics. It translates HTTP to Backend calls and errdefs classes to HTTP
// status codes, and nothing else: it holds no control-plane state and must
// not talk to NATS, workers or stores directly.
package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/torpor-dev/torpor/api"
)

// Options configures a Server.
type Options struct {
	// Log receives access logs (Debug) and failures (Warn/Error). Nil discards.
	Log *slog.Logger
	// Registry is where the gateway registers its metrics and what /metrics
	// serves. Nil gives the server a private registry.
	Registry *prometheus.Registry
	// Token is the API token every route but GET /healthz requires, as
	// "Authorization: Bearer <token>" or as the access key id of an AWS
	// SigV4 Authorization header. Empty turns authentication off.
	Token string
	// Snapshots serves /v1/snapshots; nil answers 503 there.
	Snapshots Snapshots
	// Workers serves /v1/workers and DELETE /v1/functions/{name}/instances;
	// nil answers 503 there.
	Workers Workers
}

// Server is the gateway's http.Handler.
type Server struct {
	b       Backend
	log     *slog.Logger
	auth    authenticator
	mux     *http.ServeMux
	metrics *metrics
	routes  []route
	snaps   Snapshots
	wks     Workers
	known   map[string]bool // patterns of routes
}

var _ http.Handler = (*Server)(nil)

// route is one entry of the route table. The table is the single source the
// mux, the metrics labels and the OpenAPI conformance test all read.
type route struct {
	pattern string // Go 1.22 ServeMux pattern, "METHOD /path/{wildcard}"
	handler http.HandlerFunc
}

// New returns a Server that serves the API over b.
func New(b Backend, opts Options) *Server {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Server{b: b, log: log, auth: newAuthenticator(opts.Token), mux: http.NewServeMux(), snaps: opts.Snapshots,
		wks: opts.Workers}
	s.metrics = newMetrics(reg, log)
	s.routes = []route{
		{routeHealth, s.handleHealth},
		{"GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogErrorLog{log}}).ServeHTTP},

		{"GET /v1/functions", s.handleListFunctions},
		{"PUT /v1/functions/{name}", s.handleDeploy},
		{"GET /v1/functions/{name}", s.handleGetFunction},
		{"DELETE /v1/functions/{name}", s.handleDeleteFunction},
		{"POST /v1/functions/{name}/invoke", s.handleInvoke},
		{"GET /v1/functions/{name}/calls", s.handleListCalls},
		{"GET /v1/functions/{name}/logs", s.handleLogs},
		{"DELETE /v1/functions/{name}/instances", s.handleDropInstances},
		{"GET /v1/calls/{id}", s.handleGetCall},

		{"GET /v1/snapshots", s.handleListSnapshots},
		{"POST /v1/snapshots", s.handleCreateSnapshot},
		{"GET /v1/snapshots/{id}", s.handleGetSnapshot},
		{"DELETE /v1/snapshots/{id}", s.handleDeleteSnapshot},
		{"GET /v1/snapshots/{id}/export", s.handleExportSnapshot},
		{"POST /v1/snapshots/import", s.handleImportSnapshot},
		{"POST /v1/snapshots/gc", s.handleGCSnapshots},

		{"GET /v1/workers", s.handleListWorkers},
		{"GET /v1/workers/{id}", s.handleGetWorker},
		{"POST /v1/workers/{id}/evict", s.handleEvictWorker},

		{"POST /2015-03-31/functions/{name}/invocations", s.handleLambdaInvoke},
	}
	s.known = make(map[string]bool, len(s.routes))
	for _, rt := range s.routes {
		s.mux.HandleFunc(rt.pattern, rt.handler)
		s.known[rt.pattern] = true
	}
	return s
}

// ServeHTTP checks the API token, dispatches r, records request metrics and
// writes the access log.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	_, pattern := s.mux.Handler(r)
	route := pattern
	switch {
	case !s.auth.allows(r, pattern):
		// Unknown routes too: without the token a caller learns nothing,
		// not even which paths exist.
		s.refuse(sw, r)
	case pattern == "":
		s.serveUnmatched(sw, r)
	default:
		s.mux.ServeHTTP(sw, r)
		// The mux sets r.Pattern; for a redirect to a cleaned path it
		// holds that path.
		route = r.Pattern
	}
	// Only patterns from the route table become metric labels.
	if !s.known[route] {
		route = "unmatched"
	}
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	elapsed := time.Since(start)
	s.metrics.observeRequest(route, status, elapsed)
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "http request",
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("route", route),
		slog.Int("status", status),
		slog.Int64("bytes", sw.bytes),
		slog.Duration("duration", elapsed),
		slog.String("remote", r.RemoteAddr))
}

// serveUnmatched answers a request no route matches with the /v1 error JSON,
// keeping the mux's choice between 404 and 405 (and its Allow header).
func (s *Server) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	h, _ := s.mux.Handler(r)
	probe := &headerProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	if allow := probe.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	if probe.status == http.StatusMethodNotAllowed {
		writeError(w, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed,
			"method "+r.Method+" is not allowed on "+r.URL.Path+": use "+probe.header.Get("Allow"))
		return
	}
	writeError(w, http.StatusNotFound, api.CodeNotFound, "no route for "+r.Method+" "+r.URL.Path+": see api/openapi.yaml for the routes torpor serves")
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

// statusWriter remembers the status and size of a response. It forwards
// Flush (through Unwrap, for http.ResponseController) so streaming works.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// headerProbe captures what the mux's built-in 404/405 handler would send.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }

// slogErrorLog adapts slog to promhttp's error logger.
type slogErrorLog struct{ log *slog.Logger }

func (l slogErrorLog) Println(v ...any) {
	l.log.Error("serve metrics", slog.Any("err", v))
}
