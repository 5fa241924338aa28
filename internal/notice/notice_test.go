package notice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// clock is a settable time source for token expiry and GCP deadlines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// wantErr checks that err is non-nil and contains every part.
func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

// ---- AWS ----

// fakeIMDS is an EC2 instance metadata service with IMDSv2 tokens.
type fakeIMDS struct {
	mu           sync.Mutex
	tokens       map[string]bool // valid tokens
	minted       int
	puts, gets   int
	lastToken    string // token header of the last GET
	putStatus    int    // non-zero: the token PUT fails with it
	grantTTL     string // TTL header the PUT answers with; "" echoes the request's
	requireToken bool   // GETs without a token get 401 (IMDSv2 required)
	reject       bool   // every GET gets 401
	status       int    // instance-action status; 0: 404, no notice
	body         string
}

func newFakeIMDS(t *testing.T) (*fakeIMDS, *httptest.Server) {
	f := &fakeIMDS{tokens: map[string]bool{}, requireToken: true}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeIMDS) set(fn func(*fakeIMDS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeIMDS) counts() (puts, gets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.puts, f.gets
}

// revoke makes every token issued so far invalid, as their expiry would.
func (f *fakeIMDS) revoke() { f.set(func(f *fakeIMDS) { clear(f.tokens) }) }

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case awsTokenPath:
		if r.Method != http.MethodPut {
			http.Error(w, "token needs PUT", http.StatusMethodNotAllowed)
			return
		}
		f.puts++
		if f.putStatus != 0 {
			http.Error(w, "no tokens here", f.putStatus)
			return
		}
		ttl, err := strconv.Atoi(r.Header.Get(awsTTLHeader))
		if err != nil || ttl < 1 || ttl > 21600 {
			http.Error(w, "bad TTL header", http.StatusBadRequest)
			return
		}
		f.minted++
		tok := fmt.Sprintf("token-%d", f.minted)
		f.tokens[tok] = true
		grant := f.grantTTL
		if grant == "" {
			grant = strconv.Itoa(ttl)
		}
		w.Header().Set(awsTTLHeader, grant)
		io.WriteString(w, tok)
	case awsActionPath:
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		f.gets++
		tok := r.Header.Get(awsTokenHeader)
		f.lastToken = tok
		if f.reject || (tok != "" && !f.tokens[tok]) || (tok == "" && f.requireToken) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if f.status == 0 {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(f.status)
		io.WriteString(w, f.body)
	default:
		http.NotFound(w, r)
	}
}

func newTestAWS(t *testing.T, srv *httptest.Server, c *clock) *awsSource {
	t.Helper()
	a := NewAWS(srv.URL, srv.Client()).(*awsSource)
	a.now = c.now
	return a
}

func TestAWSCheck(t *testing.T) {
	deadline := time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		setup     func(*fakeIMDS)
		want      Notice
		wantOK    bool
		errParts  []string
		errIs     error
		wantToken bool // the GET carried a token
	}{
		{name: "no notice", setup: func(*fakeIMDS) {}, wantToken: true},
		{
			name:   "terminate",
			setup:  func(f *fakeIMDS) { f.status, f.body = 200, `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}` },
			want:   Notice{Provider: "aws", Deadline: deadline, Detail: "terminate"},
			wantOK: true, wantToken: true,
		},
		{
			name:   "stop",
			setup:  func(f *fakeIMDS) { f.status, f.body = 200, `{"action": "stop", "time": "2017-09-18T08:22:00Z"}` },
			want:   Notice{Provider: "aws", Deadline: deadline, Detail: "stop"},
			wantOK: true, wantToken: true,
		},
		{
			name:   "hibernate",
			setup:  func(f *fakeIMDS) { f.status, f.body = 200, `{"action":"hibernate","time":"2017-09-18T08:22:00Z"}` },
			want:   Notice{Provider: "aws", Deadline: deadline, Detail: "hibernate"},
			wantOK: true, wantToken: true,
		},
		{
			name:     "not JSON",
			setup:    func(f *fakeIMDS) { f.status, f.body = 200, `<html>oops</html>` },
			errParts: []string{"aws", awsActionPath, "not the instance-action JSON", "oops"},
		},
		{
			name:     "missing time",
			setup:    func(f *fakeIMDS) { f.status, f.body = 200, `{"action": "terminate"}` },
			errParts: []string{"aws", awsActionPath, `has no "time"`},
		},
		{
			name:     "missing action",
			setup:    func(f *fakeIMDS) { f.status, f.body = 200, `{"action": "", "time": "2017-09-18T08:22:00Z"}` },
			errParts: []string{"aws", awsActionPath, `has no "action"`},
		},
		{
			name:     "unparseable time",
			setup:    func(f *fakeIMDS) { f.status, f.body = 200, `{"action": "stop", "time": "18/09/2017 08:22"}` },
			errParts: []string{"aws", awsActionPath, `time "18/09/2017 08:22" is not RFC 3339`},
		},
		{
			name:     "500",
			setup:    func(f *fakeIMDS) { f.status, f.body = 500, "boom" },
			errParts: []string{"aws", "GET", awsActionPath, "unexpected status 500", "boom"},
			errIs:    errdefs.ErrUnavailable,
		},
		{
			name:     "token PUT fails",
			setup:    func(f *fakeIMDS) { f.putStatus = 500 },
			errParts: []string{"aws", "PUT", awsTokenPath, "unexpected status 500"},
			errIs:    errdefs.ErrUnavailable,
		},
		{
			name:  "IMDSv1 fallback on 405",
			setup: func(f *fakeIMDS) { f.putStatus, f.requireToken = 405, false },
		},
		{
			name: "IMDSv1 fallback on 403 sees notice",
			setup: func(f *fakeIMDS) {
				f.putStatus, f.requireToken = 403, false
				f.status, f.body = 200, `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`
			},
			want:   Notice{Provider: "aws", Deadline: deadline, Detail: "terminate"},
			wantOK: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeIMDS(t)
			f.set(tc.setup)
			a := newTestAWS(t, srv, newClock())
			n, ok, err := a.Check(testenv.Ctx(t))
			if tc.errParts != nil {
				wantErr(t, err, tc.errParts...)
				if !strings.Contains(err.Error(), srv.URL) {
					t.Errorf("error %q does not name the server %s", err, srv.URL)
				}
				if tc.errIs != nil && !errors.Is(err, tc.errIs) {
					t.Errorf("error %q is not %v", err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if ok != tc.wantOK || n != tc.want {
				t.Errorf("Check = %+v, %v; want %+v, %v", n, ok, tc.want, tc.wantOK)
			}
			f.mu.Lock()
			gotToken := f.lastToken != ""
			f.mu.Unlock()
			if gotToken != tc.wantToken {
				t.Errorf("GET carried a token: %v, want %v", gotToken, tc.wantToken)
			}
		})
	}
}

func TestAWSTokenCachedAndRenewedBeforeTTL(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grant    string        // TTL the service grants ("" = as asked)
		early    time.Duration // time passed that must not renew
		late     time.Duration // further time passed that must
		wantPuts int
	}{
		{name: "six hours as asked", early: 6*time.Hour - 2*time.Minute, late: time.Minute, wantPuts: 2},
		{name: "service grants two minutes", grant: "120", early: 59 * time.Second, late: 2 * time.Second, wantPuts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeIMDS(t)
			f.set(func(f *fakeIMDS) { f.grantTTL = tc.grant })
			c := newClock()
			a := newTestAWS(t, srv, c)
			ctx := testenv.Ctx(t)
			check := func() {
				t.Helper()
				if _, _, err := a.Check(ctx); err != nil {
					t.Fatalf("Check: %v", err)
				}
			}
			check()
			check()
			c.advance(tc.early)
			check()
			if puts, gets := f.counts(); puts != 1 || gets != 3 {
				t.Fatalf("after 3 checks within the TTL: %d token PUTs, %d GETs; want 1, 3", puts, gets)
			}
			c.advance(tc.late)
			check()
			if puts, _ := f.counts(); puts != tc.wantPuts {
				t.Errorf("after the renewal point: %d token PUTs, want %d", puts, tc.wantPuts)
			}
		})
	}
}

func TestAWSTokenRefreshedOn401(t *testing.T) {
	f, srv := newFakeIMDS(t)
	f.set(func(f *fakeIMDS) {
		f.status, f.body = 200, `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`
	})
	a := newTestAWS(t, srv, newClock())
	ctx := testenv.Ctx(t)
	if _, ok, err := a.Check(ctx); err != nil || !ok {
		t.Fatalf("first Check = %v, %v", ok, err)
	}
	f.revoke() // the service forgets the token before our clock says so
	n, ok, err := a.Check(ctx)
	if err != nil || !ok || n.Detail != "terminate" {
		t.Fatalf("Check after revocation = %+v, %v, %v; want the notice", n, ok, err)
	}
	if puts, gets := f.counts(); puts != 2 || gets != 3 {
		t.Errorf("%d token PUTs, %d GETs; want 2 (one refresh), 3 (one retry)", puts, gets)
	}
	f.mu.Lock()
	last := f.lastToken
	f.mu.Unlock()
	if last != "token-2" {
		t.Errorf("retry used token %q, want the fresh token-2", last)
	}

	// A 401 that a fresh token does not cure is an error, not a loop.
	f.set(func(f *fakeIMDS) { f.reject = true })
	_, _, err = a.Check(ctx)
	wantErr(t, err, "aws", awsActionPath, "unexpected status 401")
	if puts, gets := f.counts(); puts != 3 || gets != 5 {
		t.Errorf("%d token PUTs, %d GETs; want 3, 5 (one retry, no loop)", puts, gets)
	}
}

func TestAWSFallbackToV1ThenV2Required(t *testing.T) {
	f, srv := newFakeIMDS(t)
	f.set(func(f *fakeIMDS) { f.putStatus, f.requireToken = http.StatusNotFound, false })
	a := newTestAWS(t, srv, newClock())
	ctx := testenv.Ctx(t)
	for range 2 {
		if _, _, err := a.Check(ctx); err != nil {
			t.Fatalf("Check under IMDSv1: %v", err)
		}
	}
	if puts, _ := f.counts(); puts != 1 {
		t.Fatalf("%d token PUTs under IMDSv1, want 1 (no retry per poll)", puts)
	}
	// The instance is switched to IMDSv2-only: the tokenless GET gets 401,
	// and Check fetches a token and asks again.
	f.set(func(f *fakeIMDS) { f.putStatus, f.requireToken = 0, true })
	if _, _, err := a.Check(ctx); err != nil {
		t.Fatalf("Check after IMDSv2 became required: %v", err)
	}
	f.mu.Lock()
	last := f.lastToken
	f.mu.Unlock()
	if last == "" {
		t.Error("GET after the switch carried no token")
	}
}

// ---- GCP ----

// fakeGCE is a Compute Engine metadata server's instance/preempted.
type fakeGCE struct {
	mu       sync.Mutex
	requests int
	value    func(n int) (status int, body string) // n counts requests from 1
	flavor   string                                // Metadata-Flavor the answer carries
}

func newFakeGCE(t *testing.T, value func(n int) (int, string)) (*fakeGCE, *httptest.Server) {
	f := &fakeGCE{value: value, flavor: "Google"}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeGCE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flavor != "" {
		w.Header().Set("Metadata-Flavor", f.flavor)
	}
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != gcpPath {
		http.NotFound(w, r)
		return
	}
	f.requests++
	status, body := f.value(f.requests)
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func always(status int, body string) func(int) (int, string) {
	return func(int) (int, string) { return status, body }
}

func TestGCPCheck(t *testing.T) {
	c := newClock()
	for _, tc := range []struct {
		name     string
		value    func(int) (int, string)
		flavor   string // "" keeps "Google"; "-" sends none
		want     Notice
		wantOK   bool
		errParts []string
		errIs    error
	}{
		{name: "no notice", value: always(200, "FALSE")},
		{
			name:   "preempted",
			value:  always(200, "TRUE"),
			want:   Notice{Provider: "gcp", Deadline: c.now().Add(30 * time.Second), Detail: "preempted"},
			wantOK: true,
		},
		{
			name:   "preempted with newline",
			value:  always(200, "TRUE\n"),
			want:   Notice{Provider: "gcp", Deadline: c.now().Add(30 * time.Second), Detail: "preempted"},
			wantOK: true,
		},
		{name: "malformed body", value: always(200, "maybe"), errParts: []string{"gcp", gcpPath, `"maybe" is neither TRUE nor FALSE`}},
		{name: "500", value: always(500, "backend down"), errParts: []string{"gcp", gcpPath, "unexpected status 500", "backend down"}, errIs: errdefs.ErrUnavailable},
		{
			name: "no Metadata-Flavor from server", value: always(200, "FALSE"), flavor: "-",
			errParts: []string{"gcp", gcpPath, "not a GCP metadata server"},
		},
		{
			name: "wrong Metadata-Flavor from server", value: always(200, "FALSE"), flavor: "Amazon",
			errParts: []string{"gcp", gcpPath, `Metadata-Flavor "Amazon"`, "not a GCP metadata server"},
		},
		{
			name: "body too large", value: always(200, strings.Repeat("F", maxBody+1)),
			errParts: []string{"gcp", gcpPath, "body larger than"}, errIs: errdefs.ErrTooLarge,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeGCE(t, tc.value)
			switch tc.flavor {
			case "":
			case "-":
				f.flavor = ""
			default:
				f.flavor = tc.flavor
			}
			g := NewGCP(srv.URL, srv.Client()).(*gcpSource)
			g.now = c.now
			n, ok, err := g.Check(testenv.Ctx(t))
			if tc.errParts != nil {
				wantErr(t, err, append(tc.errParts, srv.URL)...)
				if tc.errIs != nil && !errors.Is(err, tc.errIs) {
					t.Errorf("error %q is not %v", err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if ok != tc.wantOK || n != tc.want {
				t.Errorf("Check = %+v, %v; want %+v, %v", n, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// ---- Azure ----

// fakeAzureIMDS is Azure IMDS: the VM's name and Scheduled Events.
type fakeAzureIMDS struct {
	mu          sync.Mutex
	vmName      string
	nameStatus  int // non-zero: the name request fails with it
	nameReqs    int
	eventsReqs  int
	status      int // Scheduled Events status; 0: 200
	doc         string
	acks        []string // POST bodies
	ackStatus   int      // non-zero: POSTs fail with it
	knownEvents map[string]bool
}

func newFakeAzure(t *testing.T) (*fakeAzureIMDS, *httptest.Server) {
	f := &fakeAzureIMDS{vmName: "worker-7", doc: `{"DocumentIncarnation": 1, "Events": []}`}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeAzureIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Metadata") != "true" {
		http.Error(w, `{"error": "Bad request. Required metadata header not specified"}`, http.StatusBadRequest)
		return
	}
	if r.URL.Query().Get("api-version") == "" {
		http.Error(w, `{"error": "Bad request. api-version was not specified in the request"}`, http.StatusBadRequest)
		return
	}
	switch {
	case r.URL.Path == "/metadata/instance/compute/name" && r.Method == http.MethodGet:
		f.nameReqs++
		if r.URL.Query().Get("format") != "text" {
			http.Error(w, "leaf values need format=text", http.StatusBadRequest)
			return
		}
		if f.nameStatus != 0 {
			http.Error(w, "name unavailable", f.nameStatus)
			return
		}
		io.WriteString(w, f.vmName)
	case r.URL.Path == "/metadata/scheduledevents" && r.Method == http.MethodGet:
		f.eventsReqs++
		if f.status != 0 {
			w.WriteHeader(f.status)
		}
		io.WriteString(w, f.doc)
	case r.URL.Path == "/metadata/scheduledevents" && r.Method == http.MethodPost:
		b, _ := io.ReadAll(r.Body)
		f.acks = append(f.acks, string(b))
		if f.ackStatus != 0 {
			http.Error(w, "bad request", f.ackStatus)
			return
		}
	default:
		http.NotFound(w, r)
	}
}

// events renders a Scheduled Events document.
func events(evs ...string) string {
	return `{"DocumentIncarnation": 3, "Events": [` + strings.Join(evs, ",") + `]}`
}

func event(id, typ, status, notBefore string, resources ...string) string {
	rs, _ := json.Marshal(resources)
	if resources == nil {
		rs = []byte("[]")
	}
	return fmt.Sprintf(`{"EventId": %q, "EventType": %q, "ResourceType": "VirtualMachine", "Resources": %s,
		"EventStatus": %q, "NotBefore": %q, "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}`,
		id, typ, rs, status, notBefore)
}

func TestAzureCheck(t *testing.T) {
	notBefore := "Mon, 19 Sep 2016 18:29:47 GMT"
	deadline := time.Date(2016, 9, 19, 18, 29, 47, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		status   int
		doc      string
		want     Notice
		wantOK   bool
		errParts []string
		errIs    error
	}{
		{name: "no events", doc: events()},
		{
			name:   "preempt for this VM",
			doc:    events(event("E1", "Preempt", "Scheduled", notBefore, "worker-7")),
			want:   Notice{Provider: "azure", Deadline: deadline, Detail: "E1"},
			wantOK: true,
		},
		{
			name:   "preempt naming no VM",
			doc:    events(event("E1", "Preempt", "Scheduled", notBefore)),
			want:   Notice{Provider: "azure", Deadline: deadline, Detail: "E1"},
			wantOK: true,
		},
		{
			name:   "VM name matched case-insensitively",
			doc:    events(event("E1", "Preempt", "Scheduled", notBefore, "other", "WORKER-7")),
			want:   Notice{Provider: "azure", Deadline: deadline, Detail: "E1"},
			wantOK: true,
		},
		{name: "preempt for another VM ignored", doc: events(event("E1", "Preempt", "Scheduled", notBefore, "worker-8"))},
		{
			name: "maintenance events ignored",
			doc: events(
				event("E1", "Freeze", "Scheduled", notBefore, "worker-7"),
				event("E2", "Reboot", "Scheduled", notBefore, "worker-7"),
				event("E3", "Redeploy", "Scheduled", notBefore),
			),
		},
		{
			name:   "terminate counts",
			doc:    events(event("T1", "Terminate", "Scheduled", notBefore, "worker-7")),
			want:   Notice{Provider: "azure", Deadline: deadline, Detail: "T1"},
			wantOK: true,
		},
		{
			name:   "started preempt has no NotBefore",
			doc:    events(event("E1", "Preempt", "Started", "", "worker-7")),
			want:   Notice{Provider: "azure", Detail: "E1"},
			wantOK: true,
		},
		{
			name: "earliest of several",
			doc: events(
				event("T1", "Terminate", "Scheduled", "Mon, 19 Sep 2016 18:40:00 GMT", "worker-7"),
				event("E1", "Preempt", "Scheduled", notBefore, "worker-7"),
				event("E2", "Preempt", "Scheduled", notBefore, "worker-8"),
			),
			want:   Notice{Provider: "azure", Deadline: deadline, Detail: "E1"},
			wantOK: true,
		},
		{name: "not JSON", doc: "<html>", errParts: []string{"not the Scheduled Events JSON", `"<html>"`}},
		{name: "missing Events", doc: `{"DocumentIncarnation": 1}`, errParts: []string{`has no "Events"`}},
		{name: "missing DocumentIncarnation", doc: `{"Events": []}`, errParts: []string{`has no "DocumentIncarnation"`}},
		{name: "JSON of another shape", doc: `[1, 2]`, errParts: []string{"not the Scheduled Events JSON"}},
		{name: "missing EventType", doc: events(`{"EventId": "E1", "Resources": []}`), errParts: []string{`event 0 ("E1") has no EventType`}},
		{name: "missing EventId", doc: events(event("", "Preempt", "Scheduled", notBefore, "worker-7")), errParts: []string{"Preempt event 0 has no EventId"}},
		{
			name:     "unparseable NotBefore",
			doc:      events(event("E1", "Preempt", "Scheduled", "2016-09-19T18:29:47Z", "worker-7")),
			errParts: []string{"Preempt event E1", `NotBefore "2016-09-19T18:29:47Z" is not an RFC 1123 time`},
		},
		{name: "500", status: 500, doc: "oops", errParts: []string{"unexpected status 500"}, errIs: errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeAzure(t)
			f.status, f.doc = tc.status, tc.doc
			a := NewAzure(srv.URL, srv.Client())
			n, ok, err := a.Check(testenv.Ctx(t))
			if tc.errParts != nil {
				wantErr(t, err, append(tc.errParts, "azure", srv.URL+"/metadata/scheduledevents?api-version=2020-07-01")...)
				if tc.errIs != nil && !errors.Is(err, tc.errIs) {
					t.Errorf("error %q is not %v", err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if ok != tc.wantOK || !n.Deadline.Equal(tc.want.Deadline) || n.Provider != tc.want.Provider || n.Detail != tc.want.Detail {
				t.Errorf("Check = %+v, %v; want %+v, %v", n, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestAzureVMNameFetchedOnce(t *testing.T) {
	f, srv := newFakeAzure(t)
	f.nameStatus = 500
	a := NewAzure(srv.URL, srv.Client())
	ctx := testenv.Ctx(t)
	_, _, err := a.Check(ctx)
	wantErr(t, err, "azure", srv.URL+"/metadata/instance/compute/name?api-version=2021-02-01&format=text", "unexpected status 500")

	f.mu.Lock()
	f.nameStatus = 0
	f.doc = events(event("E1", "Preempt", "Scheduled", "Mon, 19 Sep 2016 18:29:47 GMT", "worker-7"))
	f.mu.Unlock()
	for range 3 {
		if _, ok, err := a.Check(ctx); err != nil || !ok {
			t.Fatalf("Check = %v, %v; want the notice", ok, err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nameReqs != 2 || f.eventsReqs != 3 {
		t.Errorf("%d name requests, %d event requests; want 2 (one failed, one cached), 3", f.nameReqs, f.eventsReqs)
	}
}

func TestAzureMissingHeaderRejected(t *testing.T) {
	// The fake refuses requests without Metadata: true or api-version, as
	// Azure does; a client that sent neither would see 400 here.
	_, srv := newFakeAzure(t)
	resp, err := srv.Client().Get(srv.URL + azureEventsPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("request without Metadata: true got %d, want 400", resp.StatusCode)
	}
	a := NewAzure(srv.URL, srv.Client())
	if _, _, err := a.Check(testenv.Ctx(t)); err != nil {
		t.Fatalf("Check (which sends the header): %v", err)
	}
}

func TestAzureAcknowledge(t *testing.T) {
	f, srv := newFakeAzure(t)
	a := NewAzure(srv.URL, srv.Client())
	ctx := testenv.Ctx(t)
	if err := a.Acknowledge(ctx, "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"); err != nil {
		t.Fatalf("Acknowledge: %v", err)
	}
	f.mu.Lock()
	acks := f.acks
	f.mu.Unlock()
	if len(acks) != 1 {
		t.Fatalf("%d POSTs, want 1", len(acks))
	}
	var body struct {
		StartRequests []struct{ EventId string } `json:"StartRequests"`
	}
	if err := json.Unmarshal([]byte(acks[0]), &body); err != nil {
		t.Fatalf("POST body %q: %v", acks[0], err)
	}
	if len(body.StartRequests) != 1 || body.StartRequests[0].EventId != "f020ba2e-3bc0-4c40-a10b-86575a9eabd5" {
		t.Errorf("POST body %s, want one StartRequest for the event", acks[0])
	}
	if want := `{"StartRequests":[{"EventId":"f020ba2e-3bc0-4c40-a10b-86575a9eabd5"}]}`; acks[0] != want {
		t.Errorf("POST body %s, want %s", acks[0], want)
	}

	err := a.Acknowledge(ctx, "")
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Acknowledge(\"\") = %v, want an ErrInvalid", err)
	}
	f.mu.Lock()
	f.ackStatus = http.StatusBadRequest
	f.mu.Unlock()
	wantErr(t, a.Acknowledge(ctx, "E9"), "acknowledge E9", "azure", "POST", "unexpected status 400")
}

// ---- shared behaviour ----

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		provider string
		want     string // Provider(); "" for nil
		err      bool
	}{
		{provider: ""}, {provider: "none"},
		{provider: "aws", want: "aws"}, {provider: "gcp", want: "gcp"}, {provider: "azure", want: "azure"},
		{provider: "ibm", err: true}, {provider: "AWS", err: true},
	} {
		t.Run("provider="+tc.provider, func(t *testing.T) {
			src, err := New(tc.provider, "")
			if tc.err {
				wantErr(t, err, strconv.Quote(tc.provider), "aws, gcp, azure or none")
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("error %v is not ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if tc.want == "" {
				if src != nil {
					t.Fatalf("New(%q) = %v, want nil", tc.provider, src)
				}
				return
			}
			if src == nil || src.Provider() != tc.want {
				t.Fatalf("New(%q) = %v, want a %s source", tc.provider, src, tc.want)
			}
		})
	}
	// The default endpoints are the documented ones.
	for _, tc := range []struct {
		src Source
		url string
	}{
		{NewAWS("", nil), "http://169.254.169.254" + awsActionPath},
		{NewGCP("", nil), "http://metadata.google.internal" + gcpPath},
		{NewAzure("", nil), "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"},
	} {
		var got string
		switch s := tc.src.(type) {
		case *awsSource:
			got = s.url
		case *gcpSource:
			got = s.url
		case *Azure:
			got = s.url
		}
		if got != tc.url {
			t.Errorf("%s default URL %s, want %s", tc.src.Provider(), got, tc.url)
		}
	}
}

func TestUnreachableAndTimeout(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL
	srv.Close()
	_, _, err := NewGCP(dead, nil).Check(testenv.Ctx(t))
	wantErr(t, err, "gcp", dead+gcpPath)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("error %v is not ErrUnavailable", err)
	}

	// A server that never answers: the request gives up after its own
	// timeout while the caller's context is still alive.
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	g := NewGCP(hang.URL, hang.Client()).(*gcpSource)
	g.timeout = 20 * time.Millisecond
	_, _, err = g.Check(testenv.Ctx(t))
	wantErr(t, err, "gcp", hang.URL+gcpPath, "no answer within 20ms")
	if !errors.Is(err, errdefs.ErrTimeout) {
		t.Errorf("error %v is not ErrTimeout", err)
	}
}

// warnings is a slog handler that keeps the warnings logged.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnings) WithGroup(string) slog.Handler            { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	var sb strings.Builder
	sb.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&sb, " %s=%v", a.Key, a.Value)
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, sb.String())
	return nil
}

func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

const poll = 2 * time.Millisecond

func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		value     func(n int) (int, string)
		wantPolls int
		wantWarns int
	}{
		{
			name: "no notice a few times, then a notice",
			value: func(n int) (int, string) {
				if n < 4 {
					return 200, "FALSE"
				}
				return 200, "TRUE"
			},
			wantPolls: 4,
		},
		{
			name: "errors first, then recovers",
			value: func(n int) (int, string) {
				switch {
				case n < 5:
					return 503, "metadata server restarting"
				case n < 7:
					return 200, "FALSE"
				}
				return 200, "TRUE"
			},
			wantPolls: 7,
			wantWarns: 1, // five identical errors within a minute: logged once
		},
		{
			name: "distinct errors each logged",
			value: func(n int) (int, string) {
				switch n {
				case 1, 2:
					return 503, "restarting"
				case 3:
					return 200, "garbage"
				}
				return 200, "TRUE"
			},
			wantPolls: 4,
			wantWarns: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeGCE(t, tc.value)
			w := &warnings{}
			n, err := Watch(testenv.Ctx(t), NewGCP(srv.URL, srv.Client()), poll, slog.New(w))
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if n.Provider != "gcp" || n.Detail != "preempted" || n.Deadline.IsZero() {
				t.Errorf("Watch = %+v, want the GCP notice", n)
			}
			f.mu.Lock()
			polls := f.requests
			f.mu.Unlock()
			if polls != tc.wantPolls {
				t.Errorf("%d polls, want %d (Watch stops at the notice)", polls, tc.wantPolls)
			}
			if got := w.list(); len(got) != tc.wantWarns {
				t.Errorf("%d warnings, want %d: %q", len(got), tc.wantWarns, got)
			}
			for _, m := range w.list() {
				if !strings.Contains(m, "provider=gcp") || !strings.Contains(m, srv.URL) {
					t.Errorf("warning %q names neither provider nor URL", m)
				}
			}
		})
	}
}

func TestWatchStopsWhenContextEnds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(polls *atomic.Int32) http.HandlerFunc
	}{
		{
			name: "between polls",
			handler: func(polls *atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					polls.Add(1)
					w.Header().Set("Metadata-Flavor", "Google")
					io.WriteString(w, "FALSE")
				}
			},
		},
		{
			name: "during a hung request",
			handler: func(polls *atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					polls.Add(1)
					<-r.Context().Done()
				}
			},
		},
		{
			name: "while errors repeat",
			handler: func(polls *atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					polls.Add(1)
					w.Header().Set("Metadata-Flavor", "Google")
					http.Error(w, "down", http.StatusInternalServerError)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var polls atomic.Int32
			srv := httptest.NewServer(tc.handler(&polls))
			t.Cleanup(srv.Close)
			ctx, cancel := context.WithCancel(testenv.Ctx(t))
			defer cancel()
			type result struct {
				n   Notice
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := Watch(ctx, NewGCP(srv.URL, srv.Client()), poll, nil)
				done <- result{n, err}
			}()
			testenv.Eventually(t, 5*time.Second, "Watch to poll", func() bool { return polls.Load() >= 1 })
			cancel()
			select {
			case r := <-done:
				if r.err != context.Canceled {
					t.Errorf("Watch = %+v, %v; want context.Canceled itself", r.n, r.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Watch did not return after its context was cancelled")
			}
		})
	}
}

func TestLimiter(t *testing.T) {
	l := newLimiter()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		text        string
		at          time.Duration
		wantOK      bool
		wantRepeats int
	}{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"b", 2 * time.Second, true, 0},
		{"a", 59 * time.Second, false, 0},
		{"a", 61 * time.Second, true, 2},
		{"a", 62 * time.Second, false, 0},
		{"b", 62 * time.Second, true, 0},
	}
	for i, s := range steps {
		repeats, ok := l.allow(s.text, t0.Add(s.at))
		if ok != s.wantOK || repeats != s.wantRepeats {
			t.Errorf("step %d (%q at %s): allow = %d, %v; want %d, %v", i, s.text, s.at, repeats, ok, s.wantRepeats, s.wantOK)
		}
	}
	// Many distinct texts do not grow the memory without bound.
	for i := range 10 * maxTexts {
		l.allow(strconv.Itoa(i), t0.Add(time.Hour+time.Duration(i)*time.Millisecond))
	}
	if len(l.seen) > maxTexts {
		t.Errorf("limiter remembers %d texts, want at most %d", len(l.seen), maxTexts)
	}
}
