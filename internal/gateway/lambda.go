package gateway

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// AWS Lambda error codes, sent in X-Amzn-ErrorType and __type. The AWS SDKs
// turn them into their typed exceptions (e.g. *types.ResourceNotFoundException
// in aws-sdk-go-v2), so the codes must be spelled exactly as AWS does.
const (
	lambdaResourceNotFound      = "ResourceNotFoundException"
	lambdaInvalidParameterValue = "InvalidParameterValueException"
	lambdaInvalidRequestContent = "InvalidRequestContentException"
	lambdaResourceConflict      = "ResourceConflictException"
	lambdaRequestTooLarge       = "RequestTooLargeException"
	lambdaTooManyRequests       = "TooManyRequestsException"
	lambdaService               = "ServiceException"
)

// Headers of the Lambda invoke API.
const (
	hdrInvocationType  = "X-Amz-Invocation-Type"
	hdrLogType         = "X-Amz-Log-Type"
	hdrLogResult       = "X-Amz-Log-Result"
	hdrFunctionError   = "X-Amz-Function-Error"
	hdrExecutedVersion = "X-Amz-Executed-Version"
	hdrRequestID       = "X-Amzn-RequestId"
	hdrErrorType       = "X-Amzn-ErrorType"
)

// logTailBytes is how much of a call's log X-Amz-Log-Result carries (as AWS).
const logTailBytes = 4 << 10

// qualifierRE is the syntax of a Lambda qualifier: $LATEST, a version or an
// alias name. torpor has no aliases, so an alias is simply not found.
var qualifierRE = regexp.MustCompile(`^[A-Za-z0-9$_-]{1,128}$`)

// lambdaError is the body of a Lambda API error. The SDKs read the code from
// X-Amzn-ErrorType (falling back to __type) and the message from message or
// Message.
type lambdaError struct {
	Type    string `json:"Type"` // User or Service: whose fault it is
	Message string `json:"message"`
	Code    string `json:"__type"`
	Reason  string `json:"Reason,omitempty"`
}

// lambdaTarget is what a Lambda invoke names: a function and a version.
type lambdaTarget struct {
	name      string
	qualifier string // as given, for messages; "" when none
	version   int    // 0 = latest
}

// arn is the ARN AWS would print for the target.
func (t lambdaTarget) arn() string {
	a := function.Version{Spec: function.Spec{Name: t.name}}.ARN()
	if t.qualifier != "" {
		a += ":" + t.qualifier
	}
	return a
}

// handleLambdaInvoke serves the AWS Lambda Invoke API so that unmodified AWS
// SDKs and tools can call torpor functions.
func (s *Server) handleLambdaInvoke(w http.ResponseWriter, r *http.Request) {
	t, err := parseLambdaTarget(r.PathValue("name"), r.URL.Query().Get("Qualifier"))
	if err != nil {
		s.lambdaFail(w, r, t, err)
		return
	}
	invType := r.Header.Get(hdrInvocationType)
	switch invType {
	case "":
		invType = "RequestResponse"
	case "RequestResponse", "Event", "DryRun":
	default:
		s.lambdaFail(w, r, t, errdefs.Invalid(fmt.Sprintf("invalid %s %q: use RequestResponse, Event or DryRun", hdrInvocationType, invType)))
		return
	}
	logType := r.Header.Get(hdrLogType)
	if logType != "" && logType != "None" && logType != "Tail" {
		s.lambdaFail(w, r, t, errdefs.Invalid(fmt.Sprintf("invalid %s %q: use None or Tail", hdrLogType, logType)))
		return
	}
	event, err := readEvent(w, r)
	if err != nil {
		s.lambdaFail(w, r, t, err)
		return
	}
	req := function.InvokeRequest{Function: t.name, Version: t.version, Payload: event}
	ctx := r.Context()
	h := w.Header()
	switch invType {
	case "DryRun":
		v, err := s.b.Function(ctx, t.name, t.version)
		if err != nil {
			s.lambdaFail(w, r, t, err)
			return
		}
		h.Set(hdrRequestID, newID())
		h.Set(hdrExecutedVersion, strconv.Itoa(v.Version))
		w.WriteHeader(http.StatusNoContent)

	case "Event":
		call, err := s.b.InvokeAsync(ctx, req)
		if err != nil {
			s.callError(t.name, err)
			s.lambdaFail(w, r, t, err)
			return
		}
		s.metrics.call(t.name, outcomeQueued)
		s.log.LogAttrs(ctx, slog.LevelDebug, "call queued", slog.String("fn", t.name), slog.String("call", call.ID))
		h.Set(hdrRequestID, call.ID)
		h.Set(hdrExecutedVersion, strconv.Itoa(call.Version))
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusAccepted)

	default:
		req.LogTail = logType == "Tail"
		res, err := s.invoke(r, req)
		if err != nil {
			s.lambdaFail(w, r, t, err)
			return
		}
		h.Set(hdrRequestID, res.CallID)
		h.Set(hdrExecutedVersion, strconv.Itoa(res.Version))
		h.Set(api.HeaderStart, res.Start)
		h.Set("Server-Timing", serverTiming(res))
		if req.LogTail {
			tail := res.LogTail
			if len(tail) > logTailBytes {
				tail = tail[len(tail)-logTailBytes:]
			}
			h.Set(hdrLogResult, base64.StdEncoding.EncodeToString(tail))
		}
		if res.Err != nil {
			h.Set(hdrFunctionError, "Unhandled")
			writeJSON(w, http.StatusOK, res.Err)
			return
		}
		writePayload(w, http.StatusOK, res.Payload)
	}
}

// parseLambdaTarget accepts every form of FunctionName that Lambda does
// (name, name:qualifier, the full ARN, the partial ARN
// ACCOUNT:function:name) plus the Qualifier query parameter.
func parseLambdaTarget(raw, queryQualifier string) (lambdaTarget, error) {
	var t lambdaTarget
	parts := strings.Split(raw, ":")
	switch {
	case len(parts) <= 2:
		t.name = parts[0]
		if len(parts) == 2 {
			t.qualifier = parts[1]
		}
	case parts[0] == "arn" && (len(parts) == 7 || len(parts) == 8) && parts[2] == "lambda" && parts[5] == "function":
		t.name = parts[6]
		if len(parts) == 8 {
			t.qualifier = parts[7]
		}
	case (len(parts) == 3 || len(parts) == 4) && parts[1] == "function":
		t.name = parts[2]
		if len(parts) == 4 {
			t.qualifier = parts[3]
		}
	default:
		t.name = raw
		return t, errdefs.Invalid(fmt.Sprintf("invalid function name %q: use a name, NAME:VERSION or a Lambda function ARN", raw))
	}
	if err := function.ValidateName(t.name); err != nil {
		return t, err
	}
	if queryQualifier != "" {
		if t.qualifier != "" && t.qualifier != queryQualifier {
			return t, errdefs.Invalid(fmt.Sprintf("the qualifier %q in the function name differs from the Qualifier parameter %q: give only one", t.qualifier, queryQualifier))
		}
		t.qualifier = queryQualifier
	}
	switch {
	case t.qualifier == "" || t.qualifier == "$LATEST":
	case !qualifierRE.MatchString(t.qualifier):
		return t, errdefs.Invalid(fmt.Sprintf("invalid qualifier %q: use $LATEST or a version number", t.qualifier))
	default:
		v, err := strconv.Atoi(t.qualifier)
		if err != nil || v < 1 {
			return t, errdefs.NotFound(fmt.Sprintf("Function not found: %s (torpor has no aliases: use $LATEST or a version number)", t.arn()))
		}
		t.version = v
	}
	return t, nil
}

// lambdaFail answers a Lambda API request with the error shape of AWS.
func (s *Server) lambdaFail(w http.ResponseWriter, r *http.Request, t lambdaTarget, err error) {
	c, msg := s.report(r, err, slog.String("fn", t.name))
	code, status, typ := c.lambda, c.status, "User"
	var reason string
	var ee *eventError
	switch {
	case errors.As(err, &ee):
		code, msg = lambdaInvalidRequestContent, "Could not parse request body into json: "+ee.detail
	case c.code == api.CodeNotFound && !strings.HasPrefix(msg, "Function not found: "):
		msg = "Function not found: " + t.arn()
	case c.code == api.CodeTooLarge && errors.Is(err, errEventTooLarge):
		msg = fmt.Sprintf("Request must be smaller than %d bytes for the InvokeFunction operation", function.MaxPayloadBytes)
	case c.code == api.CodeThrottled:
		reason = "ReservedFunctionConcurrentInvocationLimitExceeded"
		w.Header().Set("Retry-After", "1")
	case c.lambda == lambdaService:
		typ = "Service"
		if status != http.StatusServiceUnavailable && status != statusClientClosed {
			status = http.StatusInternalServerError
		}
	}
	h := w.Header()
	h.Set(hdrRequestID, newID())
	h.Set(hdrErrorType, code)
	writeJSON(w, status, lambdaError{Type: typ, Message: msg, Code: code, Reason: reason})
}
