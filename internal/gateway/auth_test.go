package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// newAuthServer runs a gateway that requires testToken, with a function
// "echo" deployed.
func newAuthServer(t *testing.T) *testServer {
	t.Helper()
	b := gatewaytest.NewBackend()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts := &testServer{Server: httptest.NewServer(New(b, Options{Log: log, Registry: reg, Token: testToken})), b: b, reg: reg}
	t.Cleanup(ts.Close)
	r := ts.do(t, "PUT", "/v1/functions/echo", deployBody(t, function.Spec{Handler: "app.handler"}, []byte("PK-zip")),
		"Authorization", "Bearer "+testToken)
	if r.status != http.StatusCreated {
		t.Fatalf("deploy echo: %d %s", r.status, r.body)
	}
	return ts
}

func sigV4(akid string) string {
	return "AWS4-HMAC-SHA256 Credential=" + akid + "/20260101/us-east-1/lambda/aws4_request, " +
		"SignedHeaders=host;x-amz-date, Signature=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
}

// authRequests is one request per route (and two no route matches), each
// valid apart from its Authorization header.
func authRequests(t *testing.T) []struct{ method, path, body string } {
	deploy := string(deployBody(t, function.Spec{Handler: "app.handler"}, []byte("PK-zip")))
	return []struct{ method, path, body string }{
		{"GET", "/healthz", ""},
		{"HEAD", "/healthz", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/functions", ""},
		{"PUT", "/v1/functions/echo", deploy},
		{"GET", "/v1/functions/echo", ""},
		{"POST", "/v1/functions/echo/invoke", "{}"},
		{"GET", "/v1/functions/echo/calls", ""},
		{"GET", "/v1/functions/echo/logs", ""},
		{"DELETE", "/v1/functions/echo/instances", ""},
		{"GET", "/v1/calls/c1", ""},
		{"GET", "/v1/snapshots", ""},
		{"POST", "/v1/snapshots", `{"function":"echo"}`},
		{"GET", "/v1/snapshots/c1", ""},
		{"DELETE", "/v1/snapshots/c1", ""},
		{"GET", "/v1/snapshots/c1/export", ""},
		{"POST", "/v1/snapshots/import", "TORPSNAP"},
		{"POST", "/v1/snapshots/gc", ""},
		{"GET", "/v1/workers", ""},
		{"GET", "/v1/workers/c1", ""},
		{"POST", "/v1/workers/c1/evict", ""},
		{"POST", "/2015-03-31/functions/echo/invocations", "{}"},
		{"DELETE", "/v1/functions/echo", ""}, // last: it removes echo
		{"GET", "/v1/nothing", ""},
		{"GET", "/2015-03-31/functions/echo", ""}, // a Lambda operation torpor lacks
	}
}

func TestAuthRoutes(t *testing.T) {
	// Every route is listed above, so a new route cannot skip this test.
	covered := map[string]bool{}
	for _, rq := range authRequests(t) {
		covered[rq.method+" "+rq.path] = true
	}
	for _, rt := range New(gatewaytest.NewBackend(), Options{}).routes {
		path := strings.NewReplacer("{name}", "echo", "{id}", "c1").Replace(rt.pattern)
		if !covered[path] {
			t.Errorf("route %q has no case in authRequests", rt.pattern)
		}
	}

	cases := []struct {
		name   string
		header []string // Authorization values; none means no header
		ok     bool
	}{
		{"no header", nil, false},
		{"bearer ok", []string{"Bearer " + testToken}, true},
		{"bearer ok, lower-case scheme", []string{"bearer " + testToken}, true},
		{"bearer ok, extra spaces", []string{"Bearer   " + testToken + " "}, true},
		{"bearer wrong", []string{"Bearer wrong-token-0123456789"}, false},
		{"bearer prefix of the token", []string{"Bearer " + testToken[:len(testToken)-1]}, false},
		{"bearer token plus a byte", []string{"Bearer " + testToken + "0"}, false},
		{"sigv4 ok", []string{sigV4(testToken)}, true},
		{"sigv4 ok, no spaces", []string{strings.ReplaceAll(sigV4(testToken), ", ", ",")}, true},
		{"sigv4 wrong key", []string{sigV4("AKIDEXAMPLE")}, false},
		{"sigv4 token as signature only", []string{"AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=" + testToken}, false},
		{"malformed: bearer without token", []string{"Bearer"}, false},
		{"malformed: bearer and space", []string{"Bearer "}, false},
		{"malformed: bare token", []string{testToken}, false},
		{"malformed: basic", []string{"Basic " + testToken}, false},
		{"malformed: sigv4 without scope", []string{"AWS4-HMAC-SHA256 Credential=" + testToken + ", SignedHeaders=host, Signature=00"}, false},
		{"malformed: sigv4 without credential", []string{"AWS4-HMAC-SHA256 SignedHeaders=host, Signature=00"}, false},
		{"malformed: sigv4 empty key", []string{sigV4("")}, false},
		{"malformed: empty", []string{""}, false},
		{"two headers, one right", []string{"Bearer wrong-token-0123456789", "Bearer " + testToken}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts := newAuthServer(t)
			for _, rq := range authRequests(t) {
				req, err := http.NewRequest(rq.method, ts.URL+rq.path, strings.NewReader(rq.body))
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range c.header {
					req.Header.Add("Authorization", h)
				}
				resp, err := ts.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				r := response{resp.StatusCode, resp.Header, body}
				checkAuthAnswer(t, rq.method+" "+rq.path, r, c.ok || rq.path == "/healthz")
			}
		})
	}
}

// checkAuthAnswer checks that r is a refusal in its API's shape, or, when
// allowed, that it is not one.
func checkAuthAnswer(t *testing.T, what string, r response, allowed bool) {
	t.Helper()
	lambdaPath := strings.Contains(what, " /2015-03-31/")
	if allowed {
		if r.status == http.StatusUnauthorized || r.status == http.StatusForbidden ||
			r.header.Get("WWW-Authenticate") != "" || r.header.Get("X-Amzn-ErrorType") == lambdaUnrecognizedClient {
			t.Errorf("%s: refused (%d %s), want it served", what, r.status, r.body)
		}
		return
	}
	if lambdaPath {
		if r.status != http.StatusForbidden || r.header.Get("X-Amzn-ErrorType") != "UnrecognizedClientException" ||
			r.header.Get("X-Amzn-RequestId") == "" {
			t.Errorf("%s: %d %v, want 403 with X-Amzn-ErrorType UnrecognizedClientException", what, r.status, r.header)
		}
		var e lambdaError
		if err := json.Unmarshal(r.body, &e); err != nil || e.Code != "UnrecognizedClientException" || e.Type != "User" ||
			!strings.Contains(e.Message, "access key id") {
			t.Errorf("%s: body %s (%v)", what, r.body, err)
		}
		return
	}
	if r.status != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("%s: %d WWW-Authenticate %q, want 401 with WWW-Authenticate Bearer (body %s)",
			what, r.status, r.header.Get("WWW-Authenticate"), r.body)
		return
	}
	e := r.apiError(t)
	want := api.Error{Code: "unauthorized", Message: "missing or invalid API token: pass Authorization: Bearer <token> " +
		"(the token is in $TORPOR_HOME/api-token on the server)"}
	if e != want {
		t.Errorf("%s: error %+v, want %+v", what, e, want)
	}
	if !strings.Contains(string(r.body), "Bearer <token>") {
		t.Errorf("%s: body %s is not readable as sent (HTML-escaped?)", what, r.body)
	}
	if strings.Contains(string(r.body), testToken) {
		t.Errorf("%s: the refusal carries the token", what)
	}
}

// Without a token the gateway is open, as before authentication existed.
func TestAuthOff(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	for _, rq := range authRequests(t) {
		if rq.method == "HEAD" {
			continue
		}
		r := ts.do(t, rq.method, rq.path, []byte(rq.body))
		checkAuthAnswer(t, rq.method+" "+rq.path, r, true)
	}
}

// Refused requests are counted under their route, so an operator sees them.
func TestAuthMetrics(t *testing.T) {
	ts := newAuthServer(t)
	ts.do(t, "GET", "/v1/functions", nil)
	ts.do(t, "GET", "/v1/functions", nil, "Authorization", "Bearer nope-nope-nope-nope")
	ts.do(t, "POST", "/2015-03-31/functions/echo/invocations", nil)
	ts.do(t, "GET", "/no/such/route", nil)
	r := ts.do(t, "GET", "/metrics", nil, "Authorization", "Bearer "+testToken)
	body := string(r.body)
	for _, want := range []string{
		`torpor_gateway_requests_total{code="401",route="GET /v1/functions"} 2`,
		`torpor_gateway_requests_total{code="403",route="POST /2015-03-31/functions/{name}/invocations"} 1`,
		`torpor_gateway_requests_total{code="401",route="unmatched"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// An unmodified AWS SDK signs with the token as its access key id and gets
// in; with another key it gets UnrecognizedClientException, as from AWS.
func TestAuthLambdaSDK(t *testing.T) {
	ts := newAuthServer(t)
	client := func(akid string) *lambda.Client {
		return lambda.NewFromConfig(aws.Config{
			Region:           "us-east-1",
			Credentials:      credentials.NewStaticCredentialsProvider(akid, "any-secret", ""),
			RetryMaxAttempts: 1,
			HTTPClient:       ts.Client(),
		}, func(o *lambda.Options) { o.BaseEndpoint = aws.String(ts.URL) })
	}
	ctx := context.Background()
	out, err := client(testToken).Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{"a":1}`)})
	if err != nil {
		t.Fatalf("invoke with the token as access key id: %v", err)
	}
	if string(out.Payload) != `{"echo":{"a":1}}` {
		t.Errorf("payload %s", out.Payload)
	}

	_, err = client("AKIDEXAMPLE").Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo")})
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("invoke with a wrong key: %v (%T), want a smithy.APIError", err, err)
	}
	if ae.ErrorCode() != "UnrecognizedClientException" || !strings.Contains(ae.ErrorMessage(), "access key id") {
		t.Errorf("code %q message %q", ae.ErrorCode(), ae.ErrorMessage())
	}
	if ae.ErrorFault() == smithy.FaultServer {
		t.Errorf("fault %v: a refused key is the client's fault", ae.ErrorFault())
	}
}

func TestPresentedToken(t *testing.T) {
	tests := []struct {
		in, tok string
		ok      bool
	}{
		{"Bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{" Bearer abc ", "abc", true},
		{"Bearer", "", false},
		{"Bearerabc", "", false},
		{"Token abc", "", false},
		{"AWS4-HMAC-SHA256 Credential=KEY/20260101/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=00", "KEY", true},
		{"AWS4-HMAC-SHA256 SignedHeaders=host,Credential=KEY/x,Signature=00", "KEY", true},
		{"AWS4-HMAC-SHA256 Credential=KEY", "", false},
		{"AWS4-HMAC-SHA256 Credential=/x", "", false},
		{"aws4-hmac-sha256 Credential=KEY/x", "", false},
		{"AWS4-HMAC-SHA256", "", false},
	}
	for _, tt := range tests {
		tok, ok := presentedToken(tt.in)
		if ok != tt.ok || (ok && tok != tt.tok) {
			t.Errorf("presentedToken(%q) = %q, %v; want %q, %v", tt.in, tok, ok, tt.tok, tt.ok)
		}
	}
}
