// Package notice notices that the cloud is about to take a spot or
// preemptible VM away: it polls the instance metadata service of AWS EC2
// (spot instance-action), Google Compute Engine (instance/preempted) or Azure
// (Scheduled Events) and reports the eviction with its deadline. It owns only
// the asking and the parsing; what a worker does about a notice (draining its
// calls, acknowledging the Azure event) is the caller's business. It must not
// import any torpor package but errdefs, and it never talks to anything but
// the one metadata endpoint it was given.
package notice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Notice is an eviction notice.
type Notice struct {
	Provider string    // "aws", "gcp", "azure"
	Deadline time.Time // when the machine is taken away; zero if the provider does not say
	// Detail is the provider's own words: the AWS action ("terminate",
	// "stop", "hibernate"), the Azure EventId (what Azure.Acknowledge takes),
	// or "preempted" on GCP.
	Detail string
}

// Source checks one provider once.
type Source interface {
	// Provider names the cloud: "aws", "gcp" or "azure".
	Provider() string
	// Check returns (notice, true, nil) when an eviction is announced,
	// (_, false, nil) when not, and an error naming the provider, the URL and
	// the problem when the metadata service cannot be asked or answers
	// something unexpected.
	Check(ctx context.Context) (Notice, bool, error)
}

// New returns the source for --eviction-notice=aws|gcp|azure, asking the
// metadata service at baseURL ("" for the cloud's own). "" and "none" mean
// no polling: New returns nil, nil.
func New(provider, baseURL string) (Source, error) {
	switch provider {
	case "", "none":
		return nil, nil
	case "aws":
		return NewAWS(baseURL, nil), nil
	case "gcp":
		return NewGCP(baseURL, nil), nil
	case "azure":
		return NewAzure(baseURL, nil), nil
	}
	return nil, errdefs.Invalid(fmt.Sprintf("eviction notice provider %q unknown: use aws, gcp, azure or none", provider))
}

// MinWarning is the shortest warning provider documents before it takes
// a machine away: AWS spot two minutes, a GCP preemption and an Azure Spot
// eviction 30 seconds; 0 for no provider. (AWS hibernation is announced
// as it happens, but a hibernated machine comes back with its calls.)
func MinWarning(provider string) time.Duration {
	switch provider {
	case "aws":
		return 2 * time.Minute
	case "gcp":
		return gcpGrace
	case "azure":
		return 30 * time.Second
	}
	return 0
}

const (
	// requestTimeout bounds each request to a metadata service, whatever the
	// polling interval: the service is link-local and answers in
	// milliseconds, so a request still open after this is lost, and the
	// next poll had better start afresh.
	requestTimeout = 2 * time.Second
	// maxBody caps what is read of a response: every document asked for
	// here is well under a kilobyte.
	maxBody = 1 << 20
	// snippet is how much of an unexpected body an error quotes.
	snippet = 120
)

// defaultClient is the client for metadata services when the caller gives
// none. It never uses a proxy: HTTP_PROXY set for the worker's outbound
// traffic must not capture requests to a link-local address that only
// this machine can reach.
func defaultClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: requestTimeout}).DialContext,
		MaxIdleConns:          2,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: requestTimeout,
	}}
}

// client holds what every provider shares: where to ask and with what.
type client struct {
	provider string
	base     string // without a trailing slash
	hc       *http.Client
	now      func() time.Time // tests move time; time.Now otherwise
	timeout  time.Duration    // per request; tests shorten requestTimeout
}

func newClient(provider, base, def string, hc *http.Client) client {
	if base == "" {
		base = def
	}
	if hc == nil {
		hc = defaultClient()
	}
	return client{provider: provider, base: strings.TrimRight(base, "/"), hc: hc, now: time.Now, timeout: requestTimeout}
}

// response is a response read in full (up to maxBody).
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request under its own timeout and reads the body.
// Its errors name the provider, method and URL; failures to reach the
// service are errdefs.ErrUnavailable, requests that outlast the timeout
// errdefs.ErrTimeout.
func (c *client) do(ctx context.Context, method, u string, header http.Header, body string) (response, error) {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(rctx, method, u, rd)
	if err != nil {
		return response{}, c.errorf(method, u, "bad request: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it repeats method and URL, which errorf adds anyway
		}
		switch {
		case ctx.Err() != nil:
			return response{}, c.errorf(method, u, "%w", ctx.Err())
		case rctx.Err() != nil:
			return response{}, c.errorf(method, u, "no answer within %s: %w", c.timeout, errdefs.ErrTimeout)
		}
		return response{}, c.errorf(method, u, "cannot reach the metadata service (%w): %w", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return response{}, c.errorf(method, u, "%w", ctx.Err())
		case rctx.Err() != nil:
			return response{}, c.errorf(method, u, "body not read within %s: %w", c.timeout, errdefs.ErrTimeout)
		}
		return response{}, c.errorf(method, u, "reading the body: %w: %w", errdefs.ErrUnavailable, err)
	}
	if len(b) > maxBody {
		return response{}, c.errorf(method, u, "body larger than %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// errorf builds an error naming the provider, the request and the problem.
func (c *client) errorf(method, u, format string, args ...any) error {
	return fmt.Errorf("%s eviction notice: %s %s: %w", c.provider, method, u, fmt.Errorf(format, args...))
}

// statusError reports an unexpected status, quoting the start of the body;
// server errors are errdefs.ErrUnavailable, since the next poll may succeed.
func (c *client) statusError(method, u string, r response) error {
	if r.status >= 500 {
		return c.errorf(method, u, "unexpected status %d %s (body %s): %w",
			r.status, http.StatusText(r.status), quote(r.body), errdefs.ErrUnavailable)
	}
	return c.errorf(method, u, "unexpected status %d %s (body %s)", r.status, http.StatusText(r.status), quote(r.body))
}

// quote renders the start of a body for an error message.
func quote(b []byte) string {
	if len(b) > snippet {
		return fmt.Sprintf("%q...", b[:snippet])
	}
	return fmt.Sprintf("%q", b)
}

// discard is the logger used when the caller gives none.
func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
