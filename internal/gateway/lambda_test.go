package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// lambdaClient is the real AWS SDK client pointed at ts. Retries are off so
// that throttling and 5xx answers surface at once.
func lambdaClient(ts *testServer) *lambda.Client {
	cfg := aws.Config{
		Region:           "us-east-1",
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDTORPOR", "secret", ""),
		RetryMaxAttempts: 1,
		HTTPClient:       ts.Client(),
	}
	return lambda.NewFromConfig(cfg, func(o *lambda.Options) { o.BaseEndpoint = aws.String(ts.URL) })
}

func TestLambdaSDKInvoke(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	ts.deploy(t, "echo")
	tail := append(bytes.Repeat([]byte("x"), 1000), []byte(strings.Repeat("0123456789abcdef", 300))...) // 5800 bytes
	ts.b.LogTail = tail
	c := lambdaClient(ts)
	ctx := context.Background()

	tests := []struct {
		name        string
		in          lambda.InvokeInput
		status      int32
		payload     string
		fnError     string
		version     string
		wantVersion int // forwarded to the backend
		logResult   []byte
	}{
		{name: "request response", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{"a":1}`)},
			status: 200, payload: `{"echo":{"a":1}}`, version: "2"},
		{name: "explicit RequestResponse, no payload", in: lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeRequestResponse},
			status: 200, payload: `{"echo":{}}`, version: "2"},
		{name: "qualifier", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("1"), Payload: []byte(`1`)},
			status: 200, payload: `{"echo":1}`, version: "1", wantVersion: 1},
		{name: "qualifier $LATEST", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("$LATEST")},
			status: 200, payload: `{"echo":{}}`, version: "2"},
		{name: "name:version", in: lambda.InvokeInput{FunctionName: aws.String("echo:1")},
			status: 200, payload: `{"echo":{}}`, version: "1", wantVersion: 1},
		{name: "full ARN", in: lambda.InvokeInput{FunctionName: aws.String("arn:aws:lambda:us-east-1:123456789012:function:echo")},
			status: 200, payload: `{"echo":{}}`, version: "2"},
		{name: "partial ARN with version", in: lambda.InvokeInput{FunctionName: aws.String("123456789012:function:echo:1")},
			status: 200, payload: `{"echo":{}}`, version: "1", wantVersion: 1},
		{name: "function error", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{"raise":"KeyError"}`)},
			status: 200, fnError: "Unhandled", version: "2"},
		{name: "log tail", in: lambda.InvokeInput{FunctionName: aws.String("echo"), LogType: types.LogTypeTail},
			status: 200, payload: `{"echo":{}}`, version: "2", logResult: tail[len(tail)-4096:]},
		{name: "event", in: lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeEvent, Payload: []byte(`{"q":1}`)},
			status: 202, version: "2"},
		{name: "dry run", in: lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeDryRun},
			status: 204, version: "2"},
		{name: "dry run version", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("1"), InvocationType: types.InvocationTypeDryRun},
			status: 204, version: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(ts.b.Invokes)
			out, err := c.Invoke(ctx, &tc.in)
			if err != nil {
				t.Fatalf("Invoke: %v", err)
			}
			if out.StatusCode != tc.status {
				t.Errorf("StatusCode %d, want %d", out.StatusCode, tc.status)
			}
			if tc.payload != "" && string(out.Payload) != tc.payload {
				t.Errorf("Payload %q, want %q", out.Payload, tc.payload)
			}
			if got := aws.ToString(out.FunctionError); got != tc.fnError {
				t.Errorf("FunctionError %q, want %q", got, tc.fnError)
			}
			if got := aws.ToString(out.ExecutedVersion); got != tc.version {
				t.Errorf("ExecutedVersion %q, want %q", got, tc.version)
			}
			reqID, _ := awsmiddleware.GetRequestIDMetadata(out.ResultMetadata)
			if reqID == "" {
				t.Errorf("no request id")
			}
			if tc.logResult != nil {
				got, err := base64.StdEncoding.DecodeString(aws.ToString(out.LogResult))
				if err != nil || !bytes.Equal(got, tc.logResult) {
					t.Errorf("LogResult is %d bytes (%v), want the last %d", len(got), err, len(tc.logResult))
				}
			} else if out.LogResult != nil {
				t.Errorf("LogResult %q without Tail", aws.ToString(out.LogResult))
			}
			if tc.fnError != "" {
				var fe function.Error
				if err := json.Unmarshal(out.Payload, &fe); err != nil || fe.ErrorType != "KeyError" || fe.ErrorMessage != "boom" || len(fe.StackTrace) == 0 {
					t.Errorf("error payload %s (%v)", out.Payload, err)
				}
			}
			if tc.in.InvocationType == types.InvocationTypeDryRun {
				if len(ts.b.Invokes) != before {
					t.Errorf("DryRun ran the function")
				}
				return
			}
			last := ts.b.Invokes[len(ts.b.Invokes)-1]
			if last.Function != "echo" || last.Version != tc.wantVersion {
				t.Errorf("backend got %+v", last)
			}
			if tc.status == 200 && reqID != ts.b.Records[reqID].ID {
				t.Errorf("request id %q is not the call id", reqID)
			}
			if last.LogTail != (tc.in.LogType == types.LogTypeTail) {
				t.Errorf("LogTail %v", last.LogTail)
			}
		})
	}
	if ts.b.Asyncs != 1 {
		t.Errorf("async calls %d, want 1", ts.b.Asyncs)
	}
}

func TestLambdaSDKErrors(t *testing.T) {
	ts := newTestServer(t)
	ts.deploy(t, "echo")
	c := lambdaClient(ts)
	tooBig := bytes.Repeat([]byte(" "), function.MaxPayloadBytes+1)

	tests := []struct {
		name    string
		backend error // injected into the fake
		in      lambda.InvokeInput
		check   func(t *testing.T, err error)
	}{
		{name: "missing function", in: lambda.InvokeInput{FunctionName: aws.String("missing")}, check: func(t *testing.T, err error) {
			var e *types.ResourceNotFoundException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
			if e.ErrorMessage() != "Function not found: arn:aws:lambda:torpor:000000000000:function:missing" || aws.ToString(e.Type) != "User" {
				t.Errorf("message %q type %q", e.ErrorMessage(), aws.ToString(e.Type))
			}
		}},
		{name: "missing version", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("7")}, check: func(t *testing.T, err error) {
			var e *types.ResourceNotFoundException
			if !errors.As(err, &e) || !strings.HasSuffix(e.ErrorMessage(), "function:echo:7") {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "alias", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("prod")}, check: func(t *testing.T, err error) {
			var e *types.ResourceNotFoundException
			if !errors.As(err, &e) || !strings.Contains(e.ErrorMessage(), "function:echo:prod") {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "missing function dry run", in: lambda.InvokeInput{FunctionName: aws.String("missing"), InvocationType: types.InvocationTypeDryRun}, check: func(t *testing.T, err error) {
			var e *types.ResourceNotFoundException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "missing function event", in: lambda.InvokeInput{FunctionName: aws.String("missing"), InvocationType: types.InvocationTypeEvent}, check: func(t *testing.T, err error) {
			var e *types.ResourceNotFoundException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "too large", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: tooBig}, check: func(t *testing.T, err error) {
			var e *types.RequestTooLargeException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
			if !strings.Contains(e.ErrorMessage(), "6291456 bytes") {
				t.Errorf("message %q", e.ErrorMessage())
			}
		}},
		{name: "not JSON", in: lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{nope`)}, check: func(t *testing.T, err error) {
			var e *types.InvalidRequestContentException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
			if !strings.HasPrefix(e.ErrorMessage(), "Could not parse request body into json: invalid character 'n'") || !strings.Contains(e.ErrorMessage(), "byte 2") {
				t.Errorf("message %q", e.ErrorMessage())
			}
		}},
		{name: "bad name", in: lambda.InvokeInput{FunctionName: aws.String("a.b")}, check: func(t *testing.T, err error) {
			var e *types.InvalidParameterValueException
			if !errors.As(err, &e) || !strings.Contains(e.ErrorMessage(), "[A-Za-z0-9_-]") {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "qualifier mismatch", in: lambda.InvokeInput{FunctionName: aws.String("echo:1"), Qualifier: aws.String("2")}, check: func(t *testing.T, err error) {
			var e *types.InvalidParameterValueException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "throttled", backend: fmt.Errorf("echo at its concurrency limit: %w", errdefs.ErrThrottled), in: lambda.InvokeInput{FunctionName: aws.String("echo")}, check: func(t *testing.T, err error) {
			var e *types.TooManyRequestsException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
			if e.Reason != types.ThrottleReasonReservedFunctionConcurrentInvocationLimitExceeded || aws.ToString(e.RetryAfterSeconds) != "1" {
				t.Errorf("reason %q retry after %q", e.Reason, aws.ToString(e.RetryAfterSeconds))
			}
		}},
		{name: "unavailable", backend: fmt.Errorf("no worker: %w", errdefs.ErrUnavailable), in: lambda.InvokeInput{FunctionName: aws.String("echo")}, check: func(t *testing.T, err error) {
			var e *types.ServiceException
			if !errors.As(err, &e) || aws.ToString(e.Type) != "Service" || !strings.Contains(e.ErrorMessage(), "no worker") {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "internal", backend: errors.New("kaboom at 10.1.1.1"), in: lambda.InvokeInput{FunctionName: aws.String("echo")}, check: func(t *testing.T, err error) {
			var e *types.ServiceException
			if !errors.As(err, &e) || strings.Contains(e.ErrorMessage(), "kaboom") {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "conflict", backend: fmt.Errorf("busy: %w", errdefs.ErrConflict), in: lambda.InvokeInput{FunctionName: aws.String("echo")}, check: func(t *testing.T, err error) {
			var e *types.ResourceConflictException
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v", err, err)
			}
		}},
		{name: "backend invalid", backend: errdefs.Invalid("event rejected"), in: lambda.InvokeInput{FunctionName: aws.String("echo")}, check: func(t *testing.T, err error) {
			var e *types.InvalidParameterValueException
			if !errors.As(err, &e) || e.ErrorMessage() != "event rejected" {
				t.Fatalf("got %T %v", err, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts.b.SetErr(tc.backend)
			defer ts.b.SetErr(nil)
			out, err := c.Invoke(context.Background(), &tc.in)
			if err == nil {
				t.Fatalf("no error; status %d payload %s", out.StatusCode, out.Payload)
			}
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("%v is not an API error", err)
			}
			tc.check(t, err)
		})
	}
}

// TestLambdaWire checks the raw wire shape of Lambda errors, for clients
// other than aws-sdk-go-v2.
func TestLambdaWire(t *testing.T) {
	ts := newTestServer(t)
	tests := []struct {
		name, path, body string
		hdr              []string
		status           int
		code, msg        string
	}{
		{"not found", "/2015-03-31/functions/ghost/invocations", "{}", nil, 404, "ResourceNotFoundException", "Function not found: arn:aws:lambda:torpor:000000000000:function:ghost"},
		{"bad json", "/2015-03-31/functions/ghost/invocations", "{", nil, 400, "InvalidRequestContentException", "Could not parse request body into json: unexpected end of JSON input"},
		{"bad invocation type", "/2015-03-31/functions/ghost/invocations", "{}", []string{"X-Amz-Invocation-Type", "Sometimes"}, 400, "InvalidParameterValueException", `"Sometimes"`},
		{"bad log type", "/2015-03-31/functions/ghost/invocations", "{}", []string{"X-Amz-Log-Type", "All"}, 400, "InvalidParameterValueException", "None or Tail"},
		{"bad ARN", "/2015-03-31/functions/arn:aws:s3:::bucket/invocations", "{}", nil, 400, "InvalidParameterValueException", "Lambda function ARN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ts.do(t, "POST", tc.path, []byte(tc.body), tc.hdr...)
			if r.status != tc.status {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := r.header.Get("X-Amzn-ErrorType"); got != tc.code {
				t.Errorf("X-Amzn-ErrorType %q", got)
			}
			if r.header.Get("X-Amzn-RequestId") == "" {
				t.Errorf("no X-Amzn-RequestId")
			}
			var e map[string]string
			if err := json.Unmarshal(r.body, &e); err != nil {
				t.Fatal(err)
			}
			if e["__type"] != tc.code || e["Type"] != "User" || !strings.Contains(e["message"], tc.msg) {
				t.Errorf("body %s", r.body)
			}
		})
	}
	// An Event call answers 202 with an empty body.
	ts.deploy(t, "echo")
	r := ts.do(t, "POST", "/2015-03-31/functions/echo/invocations", []byte("{}"), "X-Amz-Invocation-Type", "Event")
	if r.status != http.StatusAccepted || len(r.body) != 0 || r.header.Get("X-Amzn-RequestId") == "" || r.header.Get("X-Amz-Executed-Version") != "1" {
		t.Errorf("event: %d %v %q", r.status, r.header, r.body)
	}
}
