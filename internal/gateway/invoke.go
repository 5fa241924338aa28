package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// eventError is a malformed JSON event. It is an ErrInvalid; the Lambda
// route reports it as InvalidRequestContentException rather than as
// InvalidParameterValueException.
type eventError struct{ detail string }

func (e *eventError) Error() string        { return "invalid JSON event: " + e.detail + ": send a JSON value" }
func (e *eventError) Is(target error) bool { return target == errdefs.ErrInvalid }

// errEventTooLarge is the error for an event over function.MaxPayloadBytes.
var errEventTooLarge = errdefs.TooLarge(fmt.Sprintf("event over %d bytes: the payload limit is %d MB, pass large data by reference (e.g. a URL)",
	function.MaxPayloadBytes, function.MaxPayloadBytes>>20))

// readEvent reads an invoke body of at most function.MaxPayloadBytes and
// checks that it is one JSON value. An empty body is the empty object.
func readEvent(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > function.MaxPayloadBytes {
		return nil, errEventTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, function.MaxPayloadBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, errEventTooLarge
		}
		return nil, errdefs.Invalid("read request body: " + err.Error())
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte("{}"), nil
	}
	var v json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, &eventError{detail: fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)}
		}
		return nil, &eventError{detail: err.Error()}
	}
	return body, nil
}

func (s *Server) handleInvoke(w http.ResponseWriter, r *http.Request) {
	req, async, err := parseInvoke(w, r)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", req.Function))
		return
	}
	ctx := r.Context()
	if async {
		call, err := s.b.InvokeAsync(ctx, req)
		if err != nil {
			s.callError(req.Function, err)
			s.fail(w, r, err, slog.String("fn", req.Function))
			return
		}
		s.metrics.call(req.Function, outcomeQueued)
		s.log.LogAttrs(ctx, slog.LevelDebug, "call queued", slog.String("fn", req.Function), slog.String("call", call.ID))
		w.Header().Set(api.HeaderCallID, call.ID)
		w.Header().Set(api.HeaderVersion, strconv.Itoa(call.Version))
		writeJSON(w, http.StatusAccepted, call)
		return
	}
	res, err := s.invoke(r, req)
	if err != nil {
		s.fail(w, r, err, slog.String("fn", req.Function))
		return
	}
	h := w.Header()
	h.Set(api.HeaderCallID, res.CallID)
	h.Set(api.HeaderVersion, strconv.Itoa(res.Version))
	h.Set(api.HeaderStart, res.Start)
	h.Set("Server-Timing", serverTiming(res))
	if res.Err != nil {
		h.Set(api.HeaderFunctionError, api.FunctionErrorUnhandled)
		writeJSON(w, http.StatusOK, res.Err)
		return
	}
	writePayload(w, http.StatusOK, res.Payload)
}

// parseInvoke reads the name, the version and async flags and the event of
// a /v1 invoke request.
func parseInvoke(w http.ResponseWriter, r *http.Request) (function.InvokeRequest, bool, error) {
	req := function.InvokeRequest{Function: r.PathValue("name")}
	if err := function.ValidateName(req.Function); err != nil {
		return req, false, err
	}
	var async bool
	if q := r.URL.Query().Get("async"); q != "" {
		var err error
		if async, err = strconv.ParseBool(q); err != nil {
			return req, false, errdefs.Invalid(fmt.Sprintf("invalid async %q: use true or false", q))
		}
	}
	var err error
	if req.Version, err = queryVersion(r, "version"); err != nil {
		return req, false, err
	}
	if req.Payload, err = readEvent(w, r); err != nil {
		return req, false, err
	}
	return req, async, nil
}

// invoke runs a synchronous call and records its metrics and log; both
// invoke routes use it.
func (s *Server) invoke(r *http.Request, req function.InvokeRequest) (function.InvokeResult, error) {
	res, err := s.b.Invoke(r.Context(), req)
	if err != nil {
		s.callError(req.Function, err)
		return res, err
	}
	var errType string
	if res.Err != nil {
		errType = res.Err.ErrorType
		if errType == "" {
			errType = "Unhandled"
		}
	}
	s.metrics.callDone(req.Function, res.Duration, errType)
	attrs := []slog.Attr{
		slog.String("fn", req.Function), slog.String("call", res.CallID), slog.Int("version", res.Version),
		slog.String("start", res.Start), slog.Duration("start_time", res.StartTime), slog.Duration("duration", res.Duration),
	}
	if res.Err != nil {
		attrs = append(attrs, slog.String("error_type", res.Err.ErrorType))
	}
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "call done", attrs...)
	return res, nil
}

// callError counts a call the platform could not run. A not-found error
// is not counted: the name is then not a deployed function and must not
// become a label.
func (s *Server) callError(fn string, err error) {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case errors.Is(err, errdefs.ErrThrottled):
		s.metrics.call(fn, outcomeThrottled)
	default:
		s.metrics.call(fn, outcomeError)
	}
}

// serverTiming renders the Server-Timing header of a call: the time to get
// an instance and the time in the handler, in milliseconds.
func serverTiming(res function.InvokeResult) string {
	return "start;dur=" + ms(res.StartTime) + ", handler;dur=" + ms(res.Duration)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// writePayload writes a handler's result bytes unchanged.
func writePayload(w http.ResponseWriter, status int, payload []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
	w.WriteHeader(status)
	_, _ = w.Write(payload)
}
