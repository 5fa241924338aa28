package notice

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Azure announces the eviction of a Spot VM as a Scheduled Event of type
// Preempt, at least 30 seconds ahead; Scheduled Events lists the events
// of every VM in the availability set or scale-set placement group, so
// each names the VMs it affects.
// https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events
// https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service
const (
	azureDefaultBase = "http://169.254.169.254"
	azureEventsPath  = "/metadata/scheduledevents?api-version=2020-07-01"
	azureNamePath    = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
)

// azureEvictions are the event types that take the VM away for good.
// Preempt is the Spot eviction. Terminate is the deletion of a scale-set
// instance (scale-in, or a user deleting it) announced by the scale set's
// terminate notification, 5 to 15 minutes ahead: a different cause, but
// the same end for a worker, whose memory, sandboxes and local snapshots
// go with the VM. Both are reported so that the worker moves its calls
// away before either. Reboot, Redeploy and Freeze bring the VM (or, for
// Redeploy, its managed disks) back, and are maintenance, not eviction.
var azureEvictions = []string{"Preempt", "Terminate"}

// Azure checks Azure Scheduled Events. It is exported, unlike the other
// sources, for Acknowledge.
type Azure struct {
	client
	url     string
	nameURL string

	mu   sync.Mutex
	name string // this VM's name, once known
}

// NewAzure returns the source for Azure Spot evictions, asking the
// instance metadata service at baseURL ("" for http://169.254.169.254)
// with hc (nil for a client that uses no proxy).
//
// Azure turns Scheduled Events on for a VM at its first request, which may
// take up to two minutes to answer; until then Check fails with a timeout,
// and Watch logs it and keeps asking.
func NewAzure(baseURL string, hc *http.Client) *Azure {
	a := &Azure{client: newClient("azure", baseURL, azureDefaultBase, hc)}
	a.url = a.base + azureEventsPath
	a.nameURL = a.base + azureNamePath
	return a
}

var _ Source = (*Azure)(nil)

// Provider returns "azure".
func (a *Azure) Provider() string { return "azure" }

// azureEvent is one entry of Scheduled Events' Events array.
type azureEvent struct {
	EventID      string   `json:"EventId"`
	EventType    string   `json:"EventType"`
	ResourceType string   `json:"ResourceType"`
	Resources    []string `json:"Resources"`
	EventStatus  string   `json:"EventStatus"`
	NotBefore    string   `json:"NotBefore"`
}

// Check asks Scheduled Events for a Preempt or Terminate event that
// affects this VM: one whose Resources is empty or holds the VM's name.
// Of several, it reports the most urgent: one already started (it has no
// NotBefore), else the earliest NotBefore.
func (a *Azure) Check(ctx context.Context) (Notice, bool, error) {
	name, err := a.vmName(ctx)
	if err != nil {
		return Notice{}, false, err
	}
	r, err := a.do(ctx, http.MethodGet, a.url, metadataTrue(), "")
	if err != nil {
		return Notice{}, false, err
	}
	if r.status != http.StatusOK {
		return Notice{}, false, a.statusError(http.MethodGet, a.url, r)
	}
	var doc struct {
		DocumentIncarnation *int64        `json:"DocumentIncarnation"`
		Events              *[]azureEvent `json:"Events"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s is not the Scheduled Events JSON: %w", quote(r.body), err)
	}
	switch {
	case doc.DocumentIncarnation == nil:
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s has no \"DocumentIncarnation\"", quote(r.body))
	case doc.Events == nil:
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s has no \"Events\"", quote(r.body))
	}
	var (
		best  Notice
		found bool
	)
	for i, ev := range *doc.Events {
		if ev.EventType == "" {
			return Notice{}, false, a.errorf(http.MethodGet, a.url, "event %d (%q) has no EventType", i, ev.EventID)
		}
		if !slices.Contains(azureEvictions, ev.EventType) || !affects(ev.Resources, name) {
			continue
		}
		if ev.EventID == "" {
			return Notice{}, false, a.errorf(http.MethodGet, a.url, "%s event %d has no EventId", ev.EventType, i)
		}
		// NotBefore is blank once the event has started.
		var deadline time.Time
		if ev.NotBefore != "" {
			if deadline, err = parseNotBefore(ev.NotBefore); err != nil {
				return Notice{}, false, a.errorf(http.MethodGet, a.url, "%s event %s: NotBefore %q is not an RFC 1123 time: %w", ev.EventType, ev.EventID, ev.NotBefore, err)
			}
		}
		n := Notice{Provider: "azure", Deadline: deadline, Detail: ev.EventID}
		if !found || earlier(n.Deadline, best.Deadline) {
			best, found = n, true
		}
	}
	return best, found, nil
}

// Acknowledge tells Azure that this VM is ready for event eventID (the
// Detail of its Notice), so that Azure may evict it before NotBefore: the
// worker calls it once it has moved its calls away. Azure applies the
// approval to every VM the event names, not just this one.
func (a *Azure) Acknowledge(ctx context.Context, eventID string) error {
	if eventID == "" {
		return errdefs.Invalid("azure eviction notice: acknowledge: empty event ID")
	}
	body, err := json.Marshal(map[string]any{"StartRequests": []map[string]string{{"EventId": eventID}}})
	if err != nil {
		return a.errorf(http.MethodPost, a.url, "encoding the request: %w", err)
	}
	h := metadataTrue()
	h.Set("Content-Type", "application/json")
	r, err := a.do(ctx, http.MethodPost, a.url, h, string(body))
	if err != nil {
		return fmt.Errorf("acknowledge %s: %w", eventID, err)
	}
	if r.status < 200 || r.status > 299 {
		return fmt.Errorf("acknowledge %s: %w", eventID, a.statusError(http.MethodPost, a.url, r))
	}
	return nil
}

// vmName returns this VM's name, asking IMDS the first time. A failure is
// not cached: the next Check asks again.
func (a *Azure) vmName(ctx context.Context) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.name != "" {
		return a.name, nil
	}
	r, err := a.do(ctx, http.MethodGet, a.nameURL, metadataTrue(), "")
	if err != nil {
		return "", err
	}
	if r.status != http.StatusOK {
		return "", a.statusError(http.MethodGet, a.nameURL, r)
	}
	name := strings.TrimSpace(string(r.body))
	if name == "" {
		return "", a.errorf(http.MethodGet, a.nameURL, "empty VM name")
	}
	a.name = name
	return name, nil
}

// metadataTrue is the header every IMDS request must carry, which proves
// to Azure that it was not redirected there unintentionally.
func metadataTrue() http.Header {
	h := http.Header{}
	h.Set("Metadata", "true")
	return h
}

// affects reports whether an event naming resources applies to the VM
// called name. An empty list names no VM in particular and is taken to
// include this one: a needless drain costs less than a missed eviction.
// Azure resource names are case-insensitive.
func affects(resources []string, name string) bool {
	if len(resources) == 0 {
		return true
	}
	return slices.ContainsFunc(resources, func(r string) bool { return strings.EqualFold(r, name) })
}

// earlier orders deadlines with zero (already started) first.
func earlier(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() && !b.IsZero()
	}
	return a.Before(b)
}

// parseNotBefore parses an RFC 1123 time such as "Mon, 19 Sep 2016
// 18:29:47 GMT". GMT is read as UTC whatever the local zone says of that
// abbreviation; other zone names go through time.RFC1123.
func parseNotBefore(s string) (time.Time, error) {
	if t, err := time.Parse(http.TimeFormat, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC1123, s)
	return t.UTC(), err
}
