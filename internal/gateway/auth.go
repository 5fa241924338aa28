package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor/api"
)

// routeHealth is the one route open without the API token, so that load
// balancers and the CLI's start-up checks need no secret.
const routeHealth = "GET /healthz"

// lambdaPathPrefix starts every path of the AWS Lambda API. A request under
// it is answered in the Lambda error shape even when no route matches, so
// an SDK calling an operation torpor lacks still reads the auth error.
const lambdaPathPrefix = "/2015-03-31/"

// lambdaUnrecognizedClient is what AWS answers (HTTP 403) to an access key
// it does not know. aws-sdk-go-v2's lambda package has no type for it, so
// the SDK returns a *smithy.GenericAPIError with this ErrorCode, as it does
// against AWS itself.
const lambdaUnrecognizedClient = "UnrecognizedClientException"

// Messages of a refused request. They say where the token is, never what it is.
const (
	msgUnauthorized = "missing or invalid API token: pass Authorization: Bearer <token> " +
		"(the token is in $TORPOR_HOME/api-token on the server)"
	msgLambdaUnrecognizedClient = "The security token included in the request is invalid: " +
		"use the torpor API token as the AWS access key id (aws_access_key_id; any secret key); " +
		"the token is in $TORPOR_HOME/api-token on the server"
)

// authenticator checks a request's API token. The zero value (no token)
// lets every request through.
type authenticator struct {
	// sum is the SHA-256 of the token; comparing digests keeps the time
	// of a comparison independent of the token's length too.
	sum *[sha256.Size]byte
}

func newAuthenticator(token string) authenticator {
	if token == "" {
		return authenticator{}
	}
	sum := sha256.Sum256([]byte(token))
	return authenticator{sum: &sum}
}

// allows reports whether r may use the route pattern ("" when no route
// matches): always without a token, else only with one Authorization header
// that carries the token.
func (a authenticator) allows(r *http.Request, pattern string) bool {
	if a.sum == nil || pattern == routeHealth {
		return true
	}
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return false
	}
	tok, ok := presentedToken(vals[0])
	if !ok {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], a.sum[:]) == 1
}

// presentedToken extracts the token from an Authorization header value:
// "Bearer <token>" (scheme case-insensitive, RFC 9110), or an AWS SigV4
// "AWS4-HMAC-SHA256 Credential=<token>/<date>/<region>/<service>/aws4_request,
// SignedHeaders=..., Signature=..." whose access key id is the token. The
// SigV4 signature is not verified: over plain HTTP the key id is a bearer
// secret just like the Bearer token (see docs/architecture.md).
func presentedToken(h string) (string, bool) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		tok := strings.TrimSpace(rest)
		return tok, tok != ""
	case scheme == "AWS4-HMAC-SHA256":
		for _, param := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(param), "=")
			if !ok || k != "Credential" {
				continue
			}
			akid, scope, ok := strings.Cut(v, "/")
			return akid, ok && akid != "" && scope != ""
		}
	}
	return "", false
}

// refuse answers a request without the right token in the error shape of
// its API: 403 UnrecognizedClientException under the Lambda API (as AWS
// does for an unknown access key), else the /v1 error JSON with 401.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request) {
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "request refused: no valid API token",
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Bool("authorization", r.Header.Get("Authorization") != ""),
		slog.String("remote", r.RemoteAddr))
	if strings.HasPrefix(r.URL.Path, lambdaPathPrefix) {
		h := w.Header()
		h.Set(hdrRequestID, newID())
		h.Set(hdrErrorType, lambdaUnrecognizedClient)
		writeJSON(w, http.StatusForbidden, lambdaError{Type: "User", Message: msgLambdaUnrecognizedClient, Code: lambdaUnrecognizedClient})
		return
	}
	w.Header().Set("WWW-Authenticate", "Bearer")
	writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, msgUnauthorized)
}
