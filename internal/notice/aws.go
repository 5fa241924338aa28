package notice

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AWS EC2 announces a spot interruption two minutes ahead (hibernation:
// at once) by publishing spot/instance-action in the instance metadata;
// before that the item is absent and the service answers 404. The token
// flow is IMDSv2, which instances may require.
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html
const (
	awsDefaultBase = "http://169.254.169.254"
	awsTokenPath   = "/latest/api/token"
	awsActionPath  = "/latest/meta-data/spot/instance-action"
	awsTTLHeader   = "X-aws-ec2-metadata-token-ttl-seconds"
	awsTokenHeader = "X-aws-ec2-metadata-token"
	// awsTokenTTL is the longest TTL IMDSv2 grants (six hours), so that the
	// token is fetched about four times a day, not once per poll.
	awsTokenTTL = 21600 * time.Second
)

// awsSource checks EC2's spot instance-action item.
type awsSource struct {
	client

	mu       sync.Mutex
	token    string
	renewAt  time.Time // fetch a new token from then on
	imdsv1   bool      // the token PUT was refused: ask without a token
	tokenURL string
	url      string
}

// NewAWS returns the source for EC2 spot interruption notices, asking the
// instance metadata service at baseURL ("" for http://169.254.169.254)
// with hc (nil for a client that uses no proxy).
func NewAWS(baseURL string, hc *http.Client) Source {
	a := &awsSource{client: newClient("aws", baseURL, awsDefaultBase, hc)}
	a.tokenURL = a.base + awsTokenPath
	a.url = a.base + awsActionPath
	return a
}

var _ Source = (*awsSource)(nil)

func (a *awsSource) Provider() string { return "aws" }

// Check asks for spot/instance-action: 404 is no notice, 200 a JSON
// {"action": ..., "time": RFC 3339}.
func (a *awsSource) Check(ctx context.Context) (Notice, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.get(ctx)
	if err != nil {
		return Notice{}, false, err
	}
	if r.status == http.StatusUnauthorized {
		// The token expired early or was revoked, or the instance came to
		// require IMDSv2 after we fell back to v1: fetch a new one, once.
		a.token, a.imdsv1 = "", false
		if r, err = a.get(ctx); err != nil {
			return Notice{}, false, err
		}
	}
	switch r.status {
	case http.StatusNotFound:
		return Notice{}, false, nil
	case http.StatusOK:
	default:
		return Notice{}, false, a.statusError(http.MethodGet, a.url, r)
	}
	var doc struct {
		Action *string `json:"action"`
		Time   *string `json:"time"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s is not the instance-action JSON: %w", quote(r.body), err)
	}
	switch {
	case doc.Action == nil || *doc.Action == "":
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s has no \"action\"", quote(r.body))
	case doc.Time == nil || *doc.Time == "":
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "body %s has no \"time\"", quote(r.body))
	}
	t, err := time.Parse(time.RFC3339, *doc.Time)
	if err != nil {
		return Notice{}, false, a.errorf(http.MethodGet, a.url, "time %q is not RFC 3339: %w", *doc.Time, err)
	}
	// The documented actions are terminate, stop and hibernate; any other
	// is still an announced interruption, so it is reported, not refused.
	return Notice{Provider: "aws", Deadline: t, Detail: *doc.Action}, true, nil
}

// get asks for instance-action with a valid token (none under IMDSv1).
func (a *awsSource) get(ctx context.Context) (response, error) {
	h := http.Header{}
	if !a.imdsv1 {
		tok, err := a.tokenLocked(ctx)
		if err != nil {
			return response{}, err
		}
		if tok != "" {
			h.Set(awsTokenHeader, tok)
		}
	}
	return a.do(ctx, http.MethodGet, a.url, h, "")
}

// tokenLocked returns the cached IMDSv2 token, fetching a new one when
// none is cached or the cached one is about to expire. It returns "" when
// the service refuses to issue tokens (see below).
func (a *awsSource) tokenLocked(ctx context.Context) (string, error) {
	if a.token != "" && a.now().Before(a.renewAt) {
		return a.token, nil
	}
	h := http.Header{}
	h.Set(awsTTLHeader, strconv.Itoa(int(awsTokenTTL/time.Second)))
	r, err := a.do(ctx, http.MethodPut, a.tokenURL, h, "")
	if err != nil {
		return "", err
	}
	switch r.status {
	case http.StatusOK:
	case http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		// IMDSv1 fallback, as the AWS SDKs do: a metadata service that
		// predates IMDSv2 (404, 405), or one behind something that refuses
		// the PUT (403), still serves plain GETs. Were v2 in fact required,
		// the GET answers 401 and Check tries a token again.
		a.imdsv1, a.token = true, ""
		return "", nil
	default:
		return "", a.statusError(http.MethodPut, a.tokenURL, r)
	}
	tok := strings.TrimSpace(string(r.body))
	if tok == "" {
		return "", a.errorf(http.MethodPut, a.tokenURL, "empty token")
	}
	// The service says how long the token lives; it may grant less than
	// asked. Renew a minute early (half the TTL for short ones) so that
	// a token never expires between being read here and reaching IMDS.
	ttl := awsTokenTTL
	if s := r.header.Get(awsTTLHeader); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			ttl = time.Duration(n) * time.Second
		}
	}
	a.token, a.renewAt = tok, a.now().Add(ttl-min(time.Minute, ttl/2))
	return tok, nil
}
