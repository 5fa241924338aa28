package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// statusClientClosed is what the access log and metrics record when the
// client went away before the answer was ready (nginx's convention); nobody
// receives it.
const statusClientClosed = 499

// class is how one error class shows up on the wire.
type class struct {
	status int
	code   string // /v1 error code
	lambda string // AWS Lambda error code (X-Amzn-ErrorType)
	// public reports whether err's message may be shown to the client.
	// Errors of no known class can carry internals (addresses, paths), so
	// they are logged and replaced by a generic message.
	public bool
}

var (
	classNotFound    = class{http.StatusNotFound, api.CodeNotFound, lambdaResourceNotFound, true}
	classInvalid     = class{http.StatusBadRequest, api.CodeInvalid, lambdaInvalidParameterValue, true}
	classConflict    = class{http.StatusConflict, api.CodeConflict, lambdaResourceConflict, true}
	classTooLarge    = class{http.StatusRequestEntityTooLarge, api.CodeTooLarge, lambdaRequestTooLarge, true}
	classThrottled   = class{http.StatusTooManyRequests, api.CodeThrottled, lambdaTooManyRequests, true}
	classUnavailable = class{http.StatusServiceUnavailable, api.CodeUnavailable, lambdaService, true}
	classTimeout     = class{http.StatusGatewayTimeout, api.CodeTimeout, lambdaService, true}
	classInternal    = class{http.StatusInternalServerError, api.CodeInternal, lambdaService, false}
)

// classify maps an error from the Backend to its class. This is the one
// place errdefs classes become HTTP status codes.
func classify(err error) class {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return classNotFound
	case errors.Is(err, errdefs.ErrInvalid):
		return classInvalid
	case errors.Is(err, errdefs.ErrConflict):
		return classConflict
	case errors.Is(err, errdefs.ErrTooLarge):
		return classTooLarge
	case errors.Is(err, errdefs.ErrThrottled):
		return classThrottled
	case errors.Is(err, errdefs.ErrUnavailable):
		return classUnavailable
	case errors.Is(err, errdefs.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return classTimeout
	default:
		return classInternal
	}
}

// report logs a failed request at a level that matches who must act: the
// operator for internal errors (Error) and capacity problems (Warn), nobody
// for client mistakes (Debug; the access log has them too). It returns the
// class and the message to send.
func (s *Server) report(r *http.Request, err error, attrs ...slog.Attr) (class, string) {
	c := classify(err)
	attrs = append(attrs, slog.String("route", r.Pattern), slog.Any("err", err))
	ctx := r.Context()
	switch {
	case ctx.Err() != nil:
		c.status = statusClientClosed
		s.log.LogAttrs(ctx, slog.LevelDebug, "client went away", attrs...)
	case !c.public:
		ref := newID()
		s.log.LogAttrs(ctx, slog.LevelError, "request failed", append(attrs, slog.String("ref", ref))...)
		return c, "internal error (ref " + ref + "): the gateway log has the details under this ref"
	case c.status >= 500 || c.status == http.StatusTooManyRequests:
		s.log.LogAttrs(ctx, slog.LevelWarn, "request failed", attrs...)
	default:
		s.log.LogAttrs(ctx, slog.LevelDebug, "request rejected", attrs...)
	}
	return c, err.Error()
}

// fail answers a /v1 request with the error JSON for err.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error, attrs ...slog.Attr) {
	c, msg := s.report(r, err, attrs...)
	if c.status == http.StatusTooManyRequests || c.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, c.status, c.code, msg)
}

// writeError writes the /v1 error JSON.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Message: msg, Code: code})
}

// writeJSON writes v as a JSON response. Encoding our own types cannot fail
// except on a broken connection, which the client will notice by itself.
// <, > and & stay as they are (not \u003c...): the body is never HTML, and
// people read messages such as "Bearer <token>" with curl.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // Encode ends the value with '\n'
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"internal error: encode response","code":"internal"}` + "\n")
	}
	body := buf.Bytes()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// newID returns a random 128-bit id formatted like a UUID, used where AWS
// expects a request id and no call id exists, and as an error reference.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
