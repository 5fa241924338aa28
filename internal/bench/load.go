package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// target is one series: where its calls go and what a right answer is.
type target struct {
	series string
	url    string
	torpor bool   // the answer carries X-Torpor-Start and Server-Timing
	auth   string // Authorization header to send; "" sends none
}

// callResult is the outcome of one call as the client saw it.
type callResult struct {
	latency time.Duration // request written to body fully read, or to failure
	err     error         // nil when the answer was 200 with body {}
	start   string        // X-Torpor-Start (torpor only)
	status  int           // HTTP status; 0 when no answer came
	// Server-Timing of torpor's answer; -1 when absent.
	serverStart, serverHandler time.Duration
}

// newHTTPClient returns the one client every series is measured with:
// keep-alive connections, at most conc of them (a closed loop of conc
// clients; without the cap a request can dial a new connection while the
// previous response's connection is still on its way back to the pool),
// no proxy (it would be measured too), no compression, HTTP/1.1.
func newHTTPClient(conc int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: conc + 4,
		MaxConnsPerHost:     conc,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// runCalls makes n calls of t from conc goroutines, each one call at a
// time back to back (a closed loop), and returns every call's result in
// the order the calls were issued and the wall time of the whole run. It
// stops early, returning ctx's error, when ctx is cancelled.
func runCalls(ctx context.Context, hc *http.Client, t target, n, conc int) ([]callResult, time.Duration, error) {
	return runMixed(ctx, hc, func(int) target { return t }, n, conc)
}

// runMixed is runCalls where call i goes to pick(i), so that one closed
// loop can spread its calls over many functions (pick must be safe for
// concurrent use; a precomputed sequence is).
func runMixed(ctx context.Context, hc *http.Client, pick func(i int) target, n, conc int) ([]callResult, time.Duration, error) {
	results := make([]callResult, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				results[i] = call(ctx, hc, pick(i))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	if err := ctx.Err(); err != nil {
		return nil, elapsed, err
	}
	return results, elapsed, nil
}

var eventBody = []byte("{}")

// call makes one call and checks its answer.
func call(ctx context.Context, hc *http.Client, t target) callResult {
	r := callResult{serverStart: -1, serverHandler: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(eventBody))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	if t.auth != "" {
		req.Header.Set("Authorization", t.auth)
	}
	begin := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		r.latency, r.err = time.Since(begin), err
		return r
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r.latency = time.Since(begin)
	r.status = resp.StatusCode
	if err != nil {
		r.err = fmt.Errorf("read answer: %w", err)
		return r
	}
	if t.torpor {
		r.start = resp.Header.Get("X-Torpor-Start")
		r.serverStart, r.serverHandler = parseServerTiming(resp.Header.Get("Server-Timing"))
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		r.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, clip(body))
	case resp.Header.Get("X-Torpor-Function-Error") != "" || resp.Header.Get("X-Amz-Function-Error") != "":
		r.err = fmt.Errorf("function error: %s", clip(body))
	case !bytes.Equal(bytes.TrimSpace(body), eventBody):
		r.err = fmt.Errorf("answer %q, want {}", clip(body))
	}
	return r
}

func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// parseServerTiming reads "start;dur=0.4, handler;dur=3.1" (ms) into
// durations; a metric that is absent is -1.
func parseServerTiming(h string) (start, handler time.Duration) {
	start, handler = -1, -1
	for _, metric := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(metric), ";")
		for _, p := range strings.Split(params, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || k != "dur" {
				continue
			}
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			d := time.Duration(ms * float64(time.Millisecond))
			switch name {
			case "start":
				start = d
			case "handler":
				handler = d
			}
		}
	}
	return start, handler
}
