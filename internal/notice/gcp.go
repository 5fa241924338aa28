package notice

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// Compute Engine preempts a Spot or preemptible VM by sending it an ACPI
// soft-off and stopping it 30 seconds later; from the start of those 30
// seconds instance/preempted in the metadata server reads TRUE.
// https://cloud.google.com/compute/docs/instances/spot#preemption-process
// https://cloud.google.com/compute/docs/instances/create-use-spot#detect-preemption
// https://cloud.google.com/compute/docs/metadata/querying-metadata
const (
	gcpDefaultBase = "http://metadata.google.internal"
	gcpPath        = "/computeMetadata/v1/instance/preempted"
	// gcpGrace is what Compute Engine gives a preempted VM. The metadata
	// server does not say when the notice was posted, so the deadline is
	// counted from when the poll saw it: late by up to one poll interval.
	gcpGrace = 30 * time.Second
)

// gcpSource checks Compute Engine's instance/preempted value.
type gcpSource struct {
	client
	url string
}

// NewGCP returns the source for Compute Engine preemption notices, asking
// the metadata server at baseURL ("" for http://metadata.google.internal)
// with hc (nil for a client that uses no proxy).
func NewGCP(baseURL string, hc *http.Client) Source {
	g := &gcpSource{client: newClient("gcp", baseURL, gcpDefaultBase, hc)}
	g.url = g.base + gcpPath
	return g
}

var _ Source = (*gcpSource)(nil)

func (g *gcpSource) Provider() string { return "gcp" }

// Check asks for instance/preempted: TRUE is a notice, FALSE none.
func (g *gcpSource) Check(ctx context.Context) (Notice, bool, error) {
	h := http.Header{}
	h.Set("Metadata-Flavor", "Google")
	r, err := g.do(ctx, http.MethodGet, g.url, h, "")
	if err != nil {
		return Notice{}, false, err
	}
	// The metadata server marks every answer so; anything else at this
	// address (a proxy's error page, another cloud's service) must not be
	// read as FALSE, or the worker would be told it is safe when it is not
	// asking GCP at all.
	if got := r.header.Get("Metadata-Flavor"); got != "Google" {
		return Notice{}, false, g.errorf(http.MethodGet, g.url,
			"response (status %d) has header Metadata-Flavor %q, not \"Google\": not a GCP metadata server", r.status, got)
	}
	if r.status != http.StatusOK {
		return Notice{}, false, g.statusError(http.MethodGet, g.url, r)
	}
	switch v := strings.TrimSpace(string(r.body)); v {
	case "TRUE":
		return Notice{Provider: "gcp", Deadline: g.now().Add(gcpGrace), Detail: "preempted"}, true, nil
	case "FALSE":
		return Notice{}, false, nil
	}
	return Notice{}, false, g.errorf(http.MethodGet, g.url, "body %s is neither TRUE nor FALSE", quote(r.body))
}
