package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// Series names of the warm benchmark, as they appear in tables and files.
const (
	SeriesBaseline     = "baseline-python-http"
	SeriesTorporREST   = "torpor-rest"
	SeriesTorporLambda = "torpor-lambda"
)

// Defaults of WarmOptions.
const (
	DefaultWarmCalls    = 1000
	DefaultWarmWarmup   = 200
	DefaultWarmFunction = "bench-nop"
)

// DefaultWarmConcurrency is the concurrency levels measured by default:
// one client (pure latency) and eight (a worker with several hot
// instances, more than this machine class has cores).
var DefaultWarmConcurrency = []int{1, 8}

// nopCode is the benchmarked function: the cheapest handler there is, so
// that what is measured is the platform, not the function.
const nopCode = "def handler(e, c):\n    return {}\n"

// WarmOptions configures Warm. The zero value of a field means its default.
type WarmOptions struct {
	// Endpoint is the running torpor gateway, e.g. http://127.0.0.1:8080.
	Endpoint string
	// Token is the gateway's API token, sent as "Authorization: Bearer" on
	// every torpor request (the baseline gets none); empty sends none.
	Token string
	// Calls is the number of measured calls per series and concurrency.
	Calls int
	// Warmup is the number of unmeasured calls per series and concurrency
	// made first, so that measured calls find hot instances (at
	// concurrency C the worker needs C idle instances) and open
	// connections. Negative means none.
	Warmup int
	// Concurrency lists the numbers of parallel clients to measure.
	Concurrency []int
	// OutDir receives results.json, results.csv and latency.png; empty
	// means write nothing.
	OutDir string
	// Python is the interpreter of the baseline server (a name on PATH or
	// a path); it is resolved to the real binary behind any shim.
	Python string
	// Function is the name the NOP function is deployed under.
	Function string
	// Now returns the current time (tests fix it); nil means time.Now.
	Now func() time.Time
}

func (o *WarmOptions) normalize() error {
	if o.Endpoint == "" {
		return errdefs.Invalid("bench warm: no torpor endpoint: pass --endpoint or set TORPOR_ENDPOINT")
	}
	o.Endpoint = strings.TrimSuffix(o.Endpoint, "/")
	if o.Calls == 0 {
		o.Calls = DefaultWarmCalls
	}
	if o.Calls < 1 {
		return errdefs.Invalid(fmt.Sprintf("bench warm: %d calls: pass --calls 1 or more", o.Calls))
	}
	if o.Warmup == 0 {
		o.Warmup = DefaultWarmWarmup
	}
	if o.Warmup < 0 {
		o.Warmup = 0 // explicit "no warm-up": -1
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = DefaultWarmConcurrency
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > 1000 {
			return errdefs.Invalid(fmt.Sprintf("bench warm: concurrency %d: use 1-1000", c))
		}
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.Function == "" {
		o.Function = DefaultWarmFunction
	}
	if err := function.ValidateName(o.Function); err != nil {
		return err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// WarmReport is the outcome of a warm benchmark; it is also the schema of
// results.json.
type WarmReport struct {
	Kind            string    `json:"kind"` // "warm"
	Machine         Machine   `json:"machine"`
	Endpoint        string    `json:"endpoint"`
	Function        string    `json:"function"`
	FunctionVersion int       `json:"function_version"`
	Calls           int       `json:"calls"`
	Warmup          int       `json:"warmup"`
	Concurrency     []int     `json:"concurrency"`
	StartedAt       time.Time `json:"started_at"`
	FinishedAt      time.Time `json:"finished_at"`
	// Results holds one entry per series and concurrency, in the order
	// they were measured.
	Results []SeriesResult `json:"results"`
}

// SeriesResult is one series at one concurrency.
type SeriesResult struct {
	Series      string `json:"series"`
	Concurrency int    `json:"concurrency"`
	Summary
	// Starts counts X-Torpor-Start values of the measured calls (torpor
	// series only); Hot is Starts["hot"].
	Starts map[string]int `json:"starts,omitempty"`
	Hot    int            `json:"hot"`
	// RatioP50 and RatioP99 are this series' p50 and p99 over the
	// baseline's at the same concurrency in the same run (0 for the
	// baseline itself).
	RatioP50       float64 `json:"ratio_p50,omitempty"`
	RatioP99       float64 `json:"ratio_p99,omitempty"`
	WarmupFailures int     `json:"warmup_failures"`
	// Errors are up to five distinct failure messages, to say why.
	Errors []string `json:"errors,omitempty"`
	// LatenciesUS is the client-side latency of every successful measured
	// call, in the order the calls were issued.
	LatenciesUS []int64 `json:"latencies_us"`
	// ServerStartUS and ServerHandlerUS are torpor's Server-Timing of the
	// same calls: time to obtain an instance and time in the handler.
	ServerStartUS   []int64 `json:"server_start_us,omitempty"`
	ServerHandlerUS []int64 `json:"server_handler_us,omitempty"`

	calls []callResult // every measured call, for the CSV
}

// Failures returns the number of failed measured calls over all series.
func (r *WarmReport) Failures() int {
	n := 0
	for _, s := range r.Results {
		n += s.Failures
	}
	return n
}

// Warm measures the warm-call latency of a NOP Python function through
// torpor's REST and Lambda APIs against a bare Python HTTP server measured
// with the same client in the same run. It deploys opts.Function, prints
// progress and the result tables to out, and writes the raw results and
// plot to opts.OutDir. Failed calls do not make it fail: they are counted
// in the report, which the caller should check (WarmReport.Failures).
func Warm(ctx context.Context, opts WarmOptions, out io.Writer) (*WarmReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	if err := checkHealth(ctx, opts.Endpoint); err != nil {
		return nil, err
	}
	py, err := config.ResolvePython(ctx, opts.Python)
	if err != nil {
		return nil, fmt.Errorf("bench warm: baseline interpreter: %w", err)
	}
	rep := &WarmReport{
		Kind: "warm", Endpoint: opts.Endpoint, Function: opts.Function,
		Calls: opts.Calls, Warmup: opts.Warmup, Concurrency: opts.Concurrency,
		StartedAt: opts.Now().UTC(),
	}
	rep.Machine = probeMachine(ctx, py.Path, rep.StartedAt)

	base, err := StartBaseline(ctx, py.Path)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	fmt.Fprintf(out, "baseline: %s at %s\n", py.Path, base.URL)

	v, err := deployNOP(ctx, opts.Endpoint, opts.Token, opts.Function)
	if err != nil {
		return nil, err
	}
	rep.FunctionVersion = v
	fmt.Fprintf(out, "deployed %s version %d to %s\n", opts.Function, v, opts.Endpoint)

	var auth string
	if opts.Token != "" {
		auth = "Bearer " + opts.Token
	}
	// Both torpor series authenticate with the Bearer header: a SigV4
	// signature would measure the client's hashing, not the platform.
	targets := []target{
		{series: SeriesBaseline, url: base.URL + "/"},
		{series: SeriesTorporREST, url: opts.Endpoint + "/v1/functions/" + opts.Function + "/invoke", torpor: true, auth: auth},
		{series: SeriesTorporLambda, url: opts.Endpoint + "/2015-03-31/functions/" + opts.Function + "/invocations", torpor: true, auth: auth},
	}
	maxC := 0
	for _, c := range opts.Concurrency {
		maxC = max(maxC, c)
	}
	hc := newHTTPClient(maxC)
	defer hc.CloseIdleConnections()

	for _, c := range opts.Concurrency {
		for _, t := range targets {
			fmt.Fprintf(out, "%-22s c=%-3d warm-up %d, measure %d ... ", t.series, c, opts.Warmup, opts.Calls)
			warm, _, err := runCalls(ctx, hc, t, opts.Warmup, c)
			if err != nil {
				fmt.Fprintln(out)
				return nil, fmt.Errorf("bench warm: %s warm-up: %w", t.series, err)
			}
			calls, elapsed, err := runCalls(ctx, hc, t, opts.Calls, c)
			if err != nil {
				fmt.Fprintln(out)
				return nil, fmt.Errorf("bench warm: %s: %w", t.series, err)
			}
			sr := summarizeCalls(t, c, calls, elapsed)
			for _, w := range warm {
				if w.err != nil {
					sr.WarmupFailures++
				}
			}
			fmt.Fprintf(out, "%.2fs, %d failed\n", elapsed.Seconds(), sr.Failures)
			rep.Results = append(rep.Results, sr)
		}
	}
	rep.FinishedAt = opts.Now().UTC()
	computeRatios(rep)

	fmt.Fprintln(out)
	PrintWarmTable(out, rep)
	if opts.OutDir != "" {
		if err := WriteWarmResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,latency.png}\n", opts.OutDir)
	}
	return rep, nil
}

// summarizeCalls turns the measured calls of one series into its result.
func summarizeCalls(t target, c int, calls []callResult, elapsed time.Duration) SeriesResult {
	sr := SeriesResult{Series: t.series, Concurrency: c, calls: calls}
	seen := map[string]bool{}
	failures := 0
	for _, r := range calls {
		if r.err != nil {
			failures++
			if msg := r.err.Error(); !seen[msg] && len(sr.Errors) < 5 {
				seen[msg] = true
				sr.Errors = append(sr.Errors, msg)
			}
			continue
		}
		sr.LatenciesUS = append(sr.LatenciesUS, r.latency.Microseconds())
		if t.torpor {
			if sr.Starts == nil {
				sr.Starts = map[string]int{}
			}
			start := r.start
			if start == "" {
				start = "unknown"
			}
			sr.Starts[start]++
			if r.serverStart >= 0 && r.serverHandler >= 0 {
				sr.ServerStartUS = append(sr.ServerStartUS, r.serverStart.Microseconds())
				sr.ServerHandlerUS = append(sr.ServerHandlerUS, r.serverHandler.Microseconds())
			}
		}
	}
	sr.Hot = sr.Starts["hot"]
	sr.Summary = Summarize(sr.LatenciesUS, failures, elapsed)
	return sr
}

// computeRatios sets every torpor series' ratios to the baseline at the
// same concurrency.
func computeRatios(rep *WarmReport) {
	base := map[int]Summary{}
	for _, s := range rep.Results {
		if s.Series == SeriesBaseline {
			base[s.Concurrency] = s.Summary
		}
	}
	for i := range rep.Results {
		s := &rep.Results[i]
		if b, ok := base[s.Concurrency]; ok && s.Series != SeriesBaseline {
			s.RatioP50 = Ratio(s.P50US, b.P50US)
			s.RatioP99 = Ratio(s.P99US, b.P99US)
		}
	}
}

// checkHealth fails fast, with what to do, when no torpor answers.
func checkHealth(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/healthz", nil)
	if err != nil {
		return errdefs.Invalid(fmt.Sprintf("bench: bad endpoint %q: use a URL like http://127.0.0.1:8080", endpoint))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &unavailableError{msg: fmt.Sprintf("bench: cannot reach torpor at %s (start it with `torpor up`, or pass --endpoint)", endpoint), err: err}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &unavailableError{msg: fmt.Sprintf("bench: %s/healthz answered HTTP %d: is it a torpor gateway that is up?", endpoint, resp.StatusCode)}
	}
	return nil
}

// deployNOP deploys the NOP function and returns its version.
func deployNOP(ctx context.Context, endpoint, token, name string) (int, error) {
	code, err := nopZip()
	if err != nil {
		return 0, err
	}
	c, err := client.New(endpoint, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Minute}), client.WithToken(token))
	if err != nil {
		return 0, err
	}
	spec := function.Spec{Name: name, Runtime: "python3", Handler: "app.handler", MemoryMB: 128, TimeoutSec: 3}
	v, err := c.Deploy(ctx, spec, code)
	if err != nil {
		return 0, fmt.Errorf("bench warm: deploy %s to %s: %w", name, endpoint, err)
	}
	return v.Version, nil
}

// nopZip returns the code zip of the NOP function.
func nopZip() ([]byte, error) {
	b, err := codezip.FromFiles(map[string]string{"app.py": nopCode})
	if err != nil {
		return nil, fmt.Errorf("bench warm: zip the NOP function: %w", err)
	}
	return b, nil
}

// unavailableError is an errdefs.ErrUnavailable whose message says what
// to do, followed by the cause.
type unavailableError struct {
	msg string
	err error
}

func (e *unavailableError) Error() string {
	if e.err == nil {
		return e.msg
	}
	return e.msg + ": " + e.err.Error()
}

func (e *unavailableError) Unwrap() error        { return e.err }
func (e *unavailableError) Is(target error) bool { return target == errdefs.ErrUnavailable }
