// Package counter is a tiny external counter service on loopback, used to
// prove exactly-once execution: the functions a test or benchmark deploys
// increment it over HTTP, and the totals of runs whose calls were migrated
// (checkpointed on one worker, restored on another) are compared with
// those of uninterrupted runs. A call executed twice, or lost, shows as a
// wrong total.
//
// It owns only its own HTTP server and in-memory counts; it must not
// import any part of the platform, since it stands for a service outside
// torpor.
//
// Every response closes its connection and keep-alives are off, so that a
// client never holds a TCP connection between increments: a function is
// only checkpointed while it holds no socket, and an idle keep-alive
// connection would pin it.
package counter

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 200

// Server is a running counter service.
type Server struct {
	url  string
	srv  *http.Server
	done chan struct{} // closed when Serve returns

	mu     sync.Mutex
	counts map[string]int64
}

// Start listens on addr (e.g. "127.0.0.1:0") and serves in the background
// until Close.
func Start(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("counter: listen on %s: %w", addr, err)
	}
	s := &Server{url: "http://" + ln.Addr().String(), done: make(chan struct{}), counts: map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/inc", s.handleInc)
	mux.HandleFunc("/value", s.handleValue)
	mux.HandleFunc("/keys", s.handleKeys)
	s.srv = &http.Server{Handler: closing(mux), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	s.srv.SetKeepAlivesEnabled(false)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the base URL of the service, http://127.0.0.1:PORT.
func (s *Server) URL() string { return s.url }

// Value returns the count of key (0 if it was never incremented).
func (s *Server) Value(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[key]
}

// Values returns a copy of every count.
func (s *Server) Values() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.counts)
}

// Reset forgets every count, e.g. between the runs of a benchmark.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.counts)
}

// Close stops the service at once, dropping requests in flight, and waits
// for it to stop serving.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

// add adds by to key and returns the new count.
func (s *Server) add(key string, by int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[key] += by
	return s.counts[key]
}

// closing marks every response "Connection: close" (SetKeepAlivesEnabled
// makes the server close anyway; the header tells the client too, so that
// it does not try to reuse the connection).
func closing(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		h.ServeHTTP(w, r)
	})
}

// POST /inc?key=K[&by=N]: add N (default 1) to K; answers the new count
// as bare decimal text (no newline), which int() in Python and
// strconv.ParseInt both take as is.
func (s *Server) handleInc(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	q := r.URL.Query()
	key, err := keyOf(q.Get("key"))
	if err != nil {
		badRequest(w, err)
		return
	}
	by := int64(1)
	if q.Has("by") {
		v := q.Get("by")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			badRequest(w, fmt.Errorf("by=%q: want a non-negative integer (or leave it out to add 1)", v))
			return
		}
		by = n
	}
	writeText(w, s.add(key, by))
}

// GET /value?key=K: the count of K, 0 if unknown.
func (s *Server) handleValue(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	key, err := keyOf(r.URL.Query().Get("key"))
	if err != nil {
		badRequest(w, err)
		return
	}
	writeText(w, s.Value(key))
}

// GET /keys: every count as a JSON object.
func (s *Server) handleKeys(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	body, err := json.Marshal(s.Values())
	if err != nil {
		http.Error(w, "encode counts: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// allow answers 405 unless r uses method (GET also allows HEAD).
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	http.Error(w, fmt.Sprintf("method %s not allowed on %s: use %s", r.Method, r.URL.Path, method), http.StatusMethodNotAllowed)
	return false
}

// keyOf checks a key from the query string.
func keyOf(key string) (string, error) {
	switch {
	case key == "":
		return "", errors.New("missing key: pass ?key=NAME")
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("key is %d bytes long: the limit is %d", len(key), MaxKeyLen)
	}
	return key, nil
}

func badRequest(w http.ResponseWriter, err error) {
	http.Error(w, err.Error(), http.StatusBadRequest)
}

func writeText(w http.ResponseWriter, n int64) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(strconv.FormatInt(n, 10)))
}
