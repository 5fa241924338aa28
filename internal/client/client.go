// Package client is a small typed Go client of torpor's /v1 HTTP API, used
// by the CLI. It speaks only HTTP to a gateway: its contract is
// api/openapi.yaml and package api, its types are the shared data model
// (function) and error classes (errdefs); it must not import the gateway,
// dispatcher or worker.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Client calls one torpor gateway.
type Client struct {
	base  *url.URL
	hc    *http.Client
	token string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send requests through hc.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithToken makes the client send the API token as "Authorization: Bearer
// <token>"; empty sends no Authorization header.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// ResolveToken picks the API token the way the CLI documents it: flag (the
// --token flag) if set, else env (TORPOR_TOKEN) if set, else the contents
// of file ($TORPOR_HOME/api-token) when it exists and is readable, so that
// on the server's machine, as the server's user, nothing needs setting.
// Surrounding whitespace is dropped. It returns "" when there is no token;
// the server then answers 401 unless it runs with --auth none.
func ResolveToken(flag, env, file string) string {
	if tok := strings.TrimSpace(flag); tok != "" {
		return tok
	}
	if tok := strings.TrimSpace(env); tok != "" {
		return tok
	}
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "" // absent or unreadable: the 401 message says what to do
	}
	return strings.TrimSpace(string(b))
}

// New returns a client of the gateway at endpoint, e.g. http://127.0.0.1:8080.
func New(endpoint string, opts ...Option) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid torpor endpoint %q: use a URL like http://127.0.0.1:8080", endpoint)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Endpoint returns the gateway URL the client talks to.
func (c *Client) Endpoint() string { return c.base.String() }

// APIError is an error answer of the gateway. errors.Is matches it against
// the errdefs class of its code, e.g. errors.Is(err, errdefs.ErrNotFound).
type APIError struct {
	StatusCode int
	Code       string // one of the api.Code* values
	Message    string // the server's message, saying what to do
}

func (e *APIError) Error() string { return e.Message }

// Is maps the error code back to its errdefs class.
func (e *APIError) Is(target error) bool {
	switch e.Code {
	case api.CodeNotFound:
		return target == errdefs.ErrNotFound
	case api.CodeInvalid:
		return target == errdefs.ErrInvalid
	case api.CodeConflict:
		return target == errdefs.ErrConflict
	case api.CodeTooLarge:
		return target == errdefs.ErrTooLarge
	case api.CodeThrottled:
		return target == errdefs.ErrThrottled
	case api.CodeUnavailable:
		return target == errdefs.ErrUnavailable
	case api.CodeTimeout:
		return target == errdefs.ErrTimeout
	}
	return false
}

// AuthError means the gateway refused the request's API token (HTTP 401),
// or wanted one and none was sent. It wraps the gateway's *APIError.
type AuthError struct {
	Endpoint  string
	TokenSent bool // whether the request carried a token
	Err       *APIError
}

func (e *AuthError) Error() string {
	if !e.TokenSent {
		return "torpor at " + e.Endpoint + " wants an API token and none was sent: " + e.Err.Message
	}
	return "torpor at " + e.Endpoint + " refused the API token: " + e.Err.Message
}

func (e *AuthError) Unwrap() error { return e.Err }

// ConnError means the gateway could not be reached at all.
type ConnError struct {
	Endpoint string
	Err      error
}

func (e *ConnError) Error() string {
	return "cannot reach torpor at " + e.Endpoint + ": " + e.Err.Error()
}

func (e *ConnError) Unwrap() error { return e.Err }

// Is makes a ConnError an errdefs.ErrUnavailable.
func (e *ConnError) Is(target error) bool { return target == errdefs.ErrUnavailable }

// Deploy uploads a new version of spec.Name with the given code zip.
func (c *Client) Deploy(ctx context.Context, spec function.Spec, codeZip []byte) (function.Version, error) {
	var v function.Version
	if err := checkName(spec.Name); err != nil {
		return v, err
	}
	body, err := json.Marshal(api.DeployRequest{Spec: spec, CodeZip: codeZip})
	if err != nil {
		return v, fmt.Errorf("deploy %s: %w", spec.Name, err)
	}
	err = c.doJSON(ctx, http.MethodPut, fnPath(spec.Name), nil, body, &v)
	return v, err
}

// Function returns version v of name, or the latest when v is 0.
func (c *Client) Function(ctx context.Context, name string, v int) (function.Version, error) {
	var out function.Version
	if err := checkName(name); err != nil {
		return out, err
	}
	err := c.doJSON(ctx, http.MethodGet, fnPath(name), versionQuery(v), nil, &out)
	return out, err
}

// Functions lists the latest version of every function.
func (c *Client) Functions(ctx context.Context) ([]function.Version, error) {
	var out api.FunctionList
	err := c.doJSON(ctx, http.MethodGet, "/v1/functions", nil, nil, &out)
	return out.Functions, err
}

// Delete removes a function and all its versions.
func (c *Client) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, fnPath(name), nil, nil, nil)
}

// Result is the outcome of a synchronous call that ran.
type Result struct {
	CallID  string
	Version int
	Start   string // hot|warm|cold|restore
	// Payload is the handler's result, as it returned it; on a function
	// error it is the error JSON.
	Payload []byte
	// FunctionError is set when the handler raised, timed out or crashed.
	FunctionError *function.Error
	StartTime     time.Duration // time to obtain the instance (Server-Timing start)
	Duration      time.Duration // time in the handler (Server-Timing handler)
}

// Invoke calls name (version 0 = latest) with event and waits for the
// result. A handler failure is a Result with FunctionError set, not an
// error: errors mean the call could not be run. A nil event is {}.
func (c *Client) Invoke(ctx context.Context, name string, version int, event []byte) (*Result, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, http.MethodPost, fnPath(name)+"/invoke", versionQuery(version), event)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// A result is at most MaxPayloadBytes; the margin covers an error JSON
	// wrapping a message of that size.
	const maxResult = function.MaxPayloadBytes + 64<<10
	payload, err := io.ReadAll(io.LimitReader(resp.Body, maxResult+1))
	if err != nil {
		return nil, fmt.Errorf("invoke %s: read result: %w", name, err)
	}
	if len(payload) > maxResult {
		return nil, errdefs.TooLarge(fmt.Sprintf("invoke %s: the result is over %d bytes: the server broke the payload limit", name, maxResult))
	}
	res := &Result{
		CallID:  resp.Header.Get(api.HeaderCallID),
		Start:   resp.Header.Get(api.HeaderStart),
		Payload: payload,
	}
	res.Version, _ = strconv.Atoi(resp.Header.Get(api.HeaderVersion))
	res.StartTime, res.Duration = parseServerTiming(resp.Header.Get("Server-Timing"))
	if resp.Header.Get(api.HeaderFunctionError) != "" {
		res.FunctionError = &function.Error{}
		if err := json.Unmarshal(payload, res.FunctionError); err != nil {
			res.FunctionError = &function.Error{ErrorType: "Unhandled", ErrorMessage: string(payload)}
		}
	}
	return res, nil
}

// InvokeAsync queues a call of name and returns its record once the call
// is durable.
func (c *Client) InvokeAsync(ctx context.Context, name string, version int, event []byte) (function.Call, error) {
	var call function.Call
	if err := checkName(name); err != nil {
		return call, err
	}
	q := versionQuery(version)
	if q == nil {
		q = url.Values{}
	}
	q.Set("async", "true")
	err := c.doJSON(ctx, http.MethodPost, fnPath(name)+"/invoke", q, event, &call)
	return call, err
}

// Call returns the record of call id.
func (c *Client) Call(ctx context.Context, id string) (function.Call, error) {
	var call function.Call
	if id == "" || id == "." || id == ".." {
		return call, errdefs.Invalid(fmt.Sprintf("invalid call id %q: pass the id printed by invoke --async or shown by calls", id))
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/calls/"+url.PathEscape(id), nil, nil, &call)
	return call, err
}

// Calls lists up to limit recent calls of name, newest first; limit 0
// means the server's default.
func (c *Client) Calls(ctx context.Context, name string, limit int) ([]function.Call, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var q url.Values
	if limit > 0 {
		q = url.Values{"limit": {strconv.Itoa(limit)}}
	}
	var out api.CallList
	err := c.doJSON(ctx, http.MethodGet, fnPath(name)+"/calls", q, nil, &out)
	return out.Calls, err
}

// Logs streams name's log lines to fn, oldest first. With follow it keeps
// streaming until ctx is done, and then returns nil. An error from fn
// stops the stream and is returned.
func (c *Client) Logs(ctx context.Context, name string, follow bool, fn func(function.LogLine) error) error {
	if err := checkName(name); err != nil {
		return err
	}
	var q url.Values
	if follow {
		q = url.Values{"follow": {"true"}}
	}
	resp, err := c.do(ctx, http.MethodGet, fnPath(name)+"/logs", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l function.LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("logs of %s: bad line from the server: %w", name, err)
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if follow && ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("logs of %s: %w", name, err)
	}
	return nil
}

// doJSON sends body (JSON, may be nil) and decodes a 2xx answer into out
// (when non-nil).
func (c *Client) doJSON(ctx context.Context, method, p string, q url.Values, body []byte, out any) error {
	resp, err := c.do(ctx, method, p, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode the answer of %s: %w", method, p, c.base, err)
	}
	return nil
}

// do sends a request and returns the response if its status is 2xx; any
// other status becomes an *APIError carrying the server's message.
func (c *Client) do(ctx context.Context, method, p string, q url.Values, body []byte) (*http.Response, error) {
	if body == nil {
		return c.doStream(ctx, method, p, q, nil, 0, "")
	}
	return c.doStream(ctx, method, p, q, bytes.NewReader(body), int64(len(body)), "application/json")
}

// doStream is do with a streamed request body of size bytes (-1: unknown).
func (c *Client) doStream(ctx context.Context, method, p string, q url.Values, body io.Reader, size int64, contentType string) (*http.Response, error) {
	u := c.base.JoinPath(p) // p is an escaped path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, p, err)
	}
	if body != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "torpor-client")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &ConnError{Endpoint: c.base.String(), Err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	apiErr := &APIError{StatusCode: resp.StatusCode}
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Message != "" {
		apiErr.Code, apiErr.Message = e.Code, e.Message
	} else {
		msg := strings.TrimSpace(string(b))
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		apiErr.Message = fmt.Sprintf("%s %s: %s (HTTP %d): is %s a torpor gateway?", method, p, msg, resp.StatusCode, c.base)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return nil, &AuthError{Endpoint: c.base.String(), TokenSent: c.token != "", Err: apiErr}
	}
	return nil, apiErr
}

// checkName rejects a bad name before any request, with the server's rule.
func checkName(name string) error { return function.ValidateName(name) }

func fnPath(name string) string { return "/v1/functions/" + name }

func versionQuery(v int) url.Values {
	if v <= 0 {
		return nil
	}
	return url.Values{"version": {strconv.Itoa(v)}}
}

// parseServerTiming reads "start;dur=1.5, handler;dur=12" into durations.
func parseServerTiming(h string) (start, handler time.Duration) {
	for _, metric := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(metric), ";")
		for _, p := range strings.Split(params, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || k != "dur" {
				continue
			}
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			d := time.Duration(ms * float64(time.Millisecond))
			switch name {
			case "start":
				start = d
			case "handler":
				handler = d
			}
		}
	}
	return start, handler
}
