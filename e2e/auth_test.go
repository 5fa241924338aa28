package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/smithy-go"
)

// TestAuth: a server with default flags creates a private API token and
// refuses every request without it but /healthz, in the error shape of each
// API; the CLI and the AWS SDK get in with it.
func TestAuth(t *testing.T) {
	s := startServer(t)

	// The token file: 32 random bytes in hex, private to the server's user.
	path := filepath.Join(s.home, "api-token")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("%s has mode %04o, want 0600", path, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("%s is not owned by the server's user (uid %d)", path, os.Geteuid())
	}
	if raw, err := hex.DecodeString(s.token); err != nil || len(raw) != 32 {
		t.Errorf("token %q is not 32 hex-encoded bytes", s.token)
	}
	if !strings.Contains(s.out.String(), "created the API token") {
		t.Errorf("the server did not log that it created the token")
	}
	s.deploy("echo", "def handler(e, c):\n    return e\n", deployOpts{})

	noAuth := map[string]string{"Authorization": ""}
	wrong := map[string]string{"Authorization": "Bearer wrong-token-0123456789"}
	const msg = "missing or invalid API token: pass Authorization: Bearer <token> (the token is in $TORPOR_HOME/api-token on the server)"
	wantV1Refusal := func(t *testing.T, what string, r invokeResp) {
		t.Helper()
		var e struct{ Error, Code string }
		if r.Status != 401 || r.Header.Get("WWW-Authenticate") != "Bearer" ||
			json.Unmarshal([]byte(r.Body), &e) != nil || e.Code != "unauthorized" || e.Error != msg {
			t.Errorf("%s: %d WWW-Authenticate %q %s, want 401 unauthorized", what, r.Status, r.Header.Get("WWW-Authenticate"), r.Body)
		}
	}
	wantLambdaRefusal := func(t *testing.T, what string, r invokeResp) {
		t.Helper()
		if r.Status != 403 || r.Header.Get("X-Amzn-ErrorType") != "UnrecognizedClientException" ||
			!strings.Contains(r.Body, `"__type":"UnrecognizedClientException"`) {
			t.Errorf("%s: %d %v %s, want 403 UnrecognizedClientException", what, r.Status, r.Header, r.Body)
		}
	}

	t.Run("healthz is open", func(t *testing.T) {
		if r := s.get("/healthz", noAuth); r.Status != 200 {
			t.Errorf("%d %s", r.Status, r.Body)
		}
	})
	t.Run("no token", func(t *testing.T) {
		wantV1Refusal(t, "GET /v1/functions", s.get("/v1/functions", noAuth))
		wantV1Refusal(t, "POST invoke", s.post("/v1/functions/echo/invoke", `{}`, noAuth))
		wantV1Refusal(t, "GET /metrics", s.get("/metrics", noAuth))
		wantV1Refusal(t, "unknown route", s.get("/v1/nothing", noAuth))
		wantLambdaRefusal(t, "Lambda invoke", s.post("/2015-03-31/functions/echo/invocations", `{}`, noAuth))
	})
	t.Run("wrong token", func(t *testing.T) {
		wantV1Refusal(t, "GET /v1/functions", s.get("/v1/functions", wrong))
		wantV1Refusal(t, "GET /metrics", s.get("/metrics", wrong))
		wantLambdaRefusal(t, "Lambda invoke", s.post("/2015-03-31/functions/echo/invocations", `{}`, wrong))
	})
	t.Run("right token", func(t *testing.T) {
		if got := mustOK(t, s.invoke("echo", `{"a":1}`)); got != `{"a": 1}` {
			t.Errorf("REST: %s", got)
		}
		// Bearer works on the Lambda route too, for plain HTTP clients.
		if got := mustOK(t, s.post("/2015-03-31/functions/echo/invocations", `2`, nil)); got != `2` {
			t.Errorf("Lambda route with Bearer: %s", got)
		}
		if r := s.get("/metrics", nil); r.Status != 200 || !strings.Contains(r.Body, `code="401"`) {
			t.Errorf("metrics: %d, want 200 counting the refusals: %s", r.Status, tail(r.Body, 300))
		}
	})
	t.Run("AWS SDK", func(t *testing.T) {
		sdk := func(akid string) *lambda.Client {
			return lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.endpoint), RetryMaxAttempts: 1,
				Credentials: credentials.NewStaticCredentialsProvider(akid, "any-secret", "")})
		}
		ctx := context.Background()
		out, err := sdk(s.token).Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`3`)})
		if err != nil || string(out.Payload) != "3" {
			t.Errorf("with the token as access key id: %v", err)
		}
		_, err = sdk("AKIDEXAMPLE").Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo")})
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != "UnrecognizedClientException" {
			t.Errorf("with another access key id: %v, want ErrorCode UnrecognizedClientException", err)
		}
	})
	t.Run("CLI", func(t *testing.T) {
		emptyHome := t.TempDir()
		// No token anywhere.
		_, errOut, err := s.cliEnv([]string{"TORPOR_TOKEN=", "TORPOR_HOME=" + emptyHome}, "ls")
		if err == nil || !strings.Contains(errOut, "torpor at "+s.endpoint+" wants an API token and none was found") ||
			!strings.Contains(errOut, "set TORPOR_TOKEN or --token") {
			t.Errorf("without a token: %v %q", err, errOut)
		}
		// A wrong one.
		_, errOut, err = s.cliEnv([]string{"TORPOR_TOKEN=wrong-token-0123456789", "TORPOR_HOME=" + emptyHome}, "ls")
		want := "torpor: torpor at " + s.endpoint + " refused the API token: set TORPOR_TOKEN or --token (the server's token is in $TORPOR_HOME/api-token)\n"
		if err == nil || errOut != want {
			t.Errorf("with a wrong token: %v\n%q\nwant\n%q", err, errOut, want)
		}
		// On the server's machine, as its user, nothing needs setting.
		out, errOut, err := s.cliEnv([]string{"TORPOR_TOKEN=", "TORPOR_HOME=" + s.home}, "ls")
		if err != nil || !strings.Contains(out, "echo") {
			t.Errorf("with the server's home: %v %q %q", err, out, errOut)
		}
	})
	t.Run("the token survives a restart", func(t *testing.T) {
		before := s.token
		s.kill()
		s.start()
		if s.token != before {
			t.Errorf("token changed across a restart")
		}
		mustOK(t, s.invoke("echo", `{}`))
	})
}

// TestAuthOptions: --auth none serves without a token (and warns), and
// --api-token-file uses a token the operator chose.
func TestAuthOptions(t *testing.T) {
	t.Run("auth none", func(t *testing.T) {
		s := startServer(t, "--auth", "none")
		if r := s.get("/v1/functions", nil); r.Status != 200 {
			t.Errorf("without a token: %d %s", r.Status, r.Body)
		}
		if !strings.Contains(s.out.String(), "authentication is off") {
			t.Errorf("no warning that authentication is off")
		}
		if _, err := os.Stat(filepath.Join(s.home, "api-token")); err == nil {
			t.Errorf("--auth none created a token file")
		}
	})
	t.Run("api-token-file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte("operator-chosen-token-0123\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := startServer(t, "--api-token-file", file)
		if s.token != "operator-chosen-token-0123" {
			t.Fatalf("harness read %q", s.token)
		}
		if r := s.get("/v1/functions", nil); r.Status != 200 {
			t.Errorf("with the chosen token: %d %s", r.Status, r.Body)
		}
		if _, err := os.Stat(filepath.Join(s.home, "api-token")); err == nil {
			t.Errorf("a token file was created in the home despite --api-token-file")
		}
	})
}
