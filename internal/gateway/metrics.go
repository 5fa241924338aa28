package gateway

import (
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Call outcomes, the values of the outcome label of torpor_calls_total.
const (
	outcomeSucceeded = "succeeded" // the handler returned a result
	outcomeFailed    = "failed"    // the handler raised, timed out or crashed
	outcomeQueued    = "queued"    // an async call was accepted
	outcomeThrottled = "throttled" // a concurrency limit rejected the call
	outcomeError     = "error"     // the platform could not run the call
)

// maxErrorTypesPerFunction bounds the type label of
// torpor_function_errors_total: errorType is chosen by user code, so after
// this many distinct types a function's further types count as "other".
const maxErrorTypesPerFunction = 32

// errorTypeRE is what an error type must look like to become a label value
// (a Python exception name, possibly dotted); anything else is "other".
var errorTypeRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]{0,63}$`)

// durationBuckets span a cache hit (1 ms) to the longest call (15 min).
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900}

type metrics struct {
	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	calls           *prometheus.CounterVec
	callDuration    *prometheus.HistogramVec
	functionErrors  *prometheus.CounterVec

	mu         sync.Mutex
	errorTypes map[string]map[string]bool // function -> error types seen
}

func newMetrics(reg prometheus.Registerer, log *slog.Logger) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_gateway_requests_total",
			Help: "HTTP requests served by the gateway, by route pattern and status code.",
		}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "torpor_gateway_request_duration_seconds",
			Help:    "Time to serve an HTTP request, by route pattern.",
			Buckets: durationBuckets,
		}, []string{"route"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_calls_total",
			Help: "Function calls through the gateway, by function and outcome (succeeded, failed, queued, throttled, error).",
		}, []string{"function", "outcome"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "torpor_call_duration_seconds",
			Help:    "Handler time of completed synchronous calls, by function.",
			Buckets: durationBuckets,
		}, []string{"function"}),
		functionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_function_errors_total",
			Help: "Handler failures of synchronous calls, by function and error type.",
		}, []string{"function", "type"}),
		errorTypes: map[string]map[string]bool{},
	}
	m.requests = register(reg, log, m.requests)
	m.requestDuration = register(reg, log, m.requestDuration)
	m.calls = register(reg, log, m.calls)
	m.callDuration = register(reg, log, m.callDuration)
	m.functionErrors = register(reg, log, m.functionErrors)
	return m
}

// register registers c, or reuses the collector already registered under
// the same name (a second Server on one registry). On any other failure the
// metric still counts but is not exported, and the failure is logged.
func register[C prometheus.Collector](reg prometheus.Registerer, log *slog.Logger, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	log.Error("register gateway metric: it will not be exported", slog.Any("err", err))
	return c
}

func (m *metrics) observeRequest(route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.requestDuration.WithLabelValues(route).Observe(d.Seconds())
}

// call counts one call of fn. Callers pass only names of functions known to
// exist (never after a not-found error), so labels stay bounded by the
// number of deployed functions.
func (m *metrics) call(fn, outcome string) {
	m.calls.WithLabelValues(fn, outcome).Inc()
}

func (m *metrics) callDone(fn string, handler time.Duration, errType string) {
	m.callDuration.WithLabelValues(fn).Observe(handler.Seconds())
	if errType == "" {
		m.call(fn, outcomeSucceeded)
		return
	}
	m.call(fn, outcomeFailed)
	m.functionErrors.WithLabelValues(fn, m.errorTypeLabel(fn, errType)).Inc()
}

func (m *metrics) errorTypeLabel(fn, errType string) string {
	if !errorTypeRE.MatchString(errType) {
		return "other"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := m.errorTypes[fn]
	if seen == nil {
		seen = map[string]bool{}
		m.errorTypes[fn] = seen
	}
	if !seen[errType] && len(seen) >= maxErrorTypesPerFunction {
		return "other"
	}
	seen[errType] = true
	return errType
}

// forget drops every series of a deleted function.
func (m *metrics) forget(fn string) {
	l := prometheus.Labels{"function": fn}
	m.calls.DeletePartialMatch(l)
	m.callDuration.DeletePartialMatch(l)
	m.functionErrors.DeletePartialMatch(l)
	m.mu.Lock()
	delete(m.errorTypes, fn)
	m.mu.Unlock()
}
