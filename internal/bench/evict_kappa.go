package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// The Kappa-style baseline of the overhead part checkpoints at the
// application level, as Kappa does: every period the function pickles its
// state and sends it to a coordinator, which keeps it in stable storage
// (here the same blob store as torpor's snapshots: a local directory or
// MinIO); a call run again after an eviction asks for the last state and
// carries on from it. kappaRelay is that coordinator.

// kappaRelay serves PUT and GET /state/{key} on loopback over a blob store.
type kappaRelay struct {
	url   string
	srv   *http.Server
	store blob.Store
	done  chan struct{}
}

func startKappaRelay(store blob.Store) (*kappaRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("kappa relay: %w", err)
	}
	k := &kappaRelay{url: "http://" + ln.Addr().String(), store: store, done: make(chan struct{})}
	k.srv = &http.Server{Handler: http.HandlerFunc(k.serve), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	// No keep-alive: a function holding an idle connection could not be
	// checkpointed (the same rule as the counter's).
	k.srv.SetKeepAlivesEnabled(false)
	go func() {
		defer close(k.done)
		_ = k.srv.Serve(ln)
	}()
	return k, nil
}

// stateURL is where the function keeps the state of key.
func (k *kappaRelay) stateURL(key string) string { return k.url + "/state/" + key }

func (k *kappaRelay) close() {
	_ = k.srv.Close()
	<-k.done
}

func (k *kappaRelay) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	key, ok := strings.CutPrefix(r.URL.Path, "/state/")
	if !ok || blob.ValidateKey("kappa/"+key) != nil {
		http.Error(w, "use /state/KEY", http.StatusNotFound)
		return
	}
	key = "kappa/" + key
	switch r.Method {
	case http.MethodPut:
		if _, err := k.store.Put(r.Context(), key, r.Body, r.ContentLength); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		rc, info, err := k.store.Get(r.Context(), key)
		if errors.Is(err, errdefs.ErrNotFound) {
			http.Error(w, "no state", http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
		_, _ = io.Copy(w, rc)
	default:
		http.Error(w, "use PUT or GET", http.StatusMethodNotAllowed)
	}
}
