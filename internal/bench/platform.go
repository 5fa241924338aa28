package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// PlatformOptions is what every benchmark of a running torpor needs. The
// zero value of a field means its default.
type PlatformOptions struct {
	// Endpoint is the running torpor gateway, e.g. http://127.0.0.1:8080.
	Endpoint string
	// Token is the gateway's API token, sent as "Authorization: Bearer" on
	// every torpor request (baselines get none); empty sends none.
	Token string
	// OutDir receives results.json, results.csv and the plots; empty means
	// write nothing.
	OutDir string
	// Python is the baseline's interpreter (a name on PATH or a path); it
	// is resolved to the real binary behind any shim, as `torpor up` does.
	Python string
	// Now returns the current time (tests fix it); nil means time.Now.
	Now func() time.Time
}

func (o *PlatformOptions) normalize(cmd string) error {
	if o.Endpoint == "" {
		return errdefs.Invalid("bench " + cmd + ": no torpor endpoint: pass --endpoint or set TORPOR_ENDPOINT")
	}
	o.Endpoint = strings.TrimSuffix(o.Endpoint, "/")
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// nopMemoryMB is the memory limit of the functions the fast-start
// benchmarks deploy by the hundred: the smallest torpor accepts, so that
// the worker's memory budget (a sum of limits) is not what stops them.
const nopMemoryMB = function.MinMemoryMB

// sleepCode is the IO-bound function of the bursts benchmark's background.
const sleepCode = "import time\n\ndef handler(e, c):\n    time.sleep(0.05)\n    return {}\n"

// platform is a running torpor, driven through its public HTTP API only.
type platform struct {
	endpoint string
	auth     string         // "Bearer <token>", or "" for none
	cli      *client.Client // control requests; never the measured client
}

func newPlatform(endpoint, token string) (*platform, error) {
	hc := &http.Client{Timeout: 2 * time.Minute}
	c, err := client.New(endpoint, client.WithHTTPClient(hc), client.WithToken(token))
	if err != nil {
		return nil, err
	}
	p := &platform{endpoint: endpoint, cli: c}
	if token != "" {
		p.auth = "Bearer " + token
	}
	return p, nil
}

// start prepares a platform benchmark: it checks that torpor answers,
// resolves the baseline interpreter and describes the machine.
func (o *PlatformOptions) start(ctx context.Context, cmd string) (*platform, config.Interpreter, Machine, error) {
	if err := checkHealth(ctx, o.Endpoint); err != nil {
		return nil, config.Interpreter{}, Machine{}, err
	}
	py, err := config.ResolvePython(ctx, o.Python)
	if err != nil {
		return nil, py, Machine{}, fmt.Errorf("bench %s: baseline interpreter: %w", cmd, err)
	}
	p, err := newPlatform(o.Endpoint, o.Token)
	if err != nil {
		return nil, py, Machine{}, err
	}
	return p, py, probeMachine(ctx, py.Path, o.Now().UTC()), nil
}

// invoke returns the target that calls name through the REST API.
func (p *platform) invoke(series, name string) target {
	return target{series: series, url: p.endpoint + "/v1/functions/" + name + "/invoke", torpor: true, auth: p.auth}
}

// deploy deploys code (app.py, handler app.handler) as name and returns
// the new version.
func (p *platform) deploy(ctx context.Context, name, code string) (int, error) {
	zip, err := codezip.FromFiles(map[string]string{"app.py": code})
	if err != nil {
		return 0, fmt.Errorf("zip %s: %w", name, err)
	}
	spec := function.Spec{Name: name, Runtime: "python3", Handler: "app.handler", MemoryMB: nopMemoryMB, TimeoutSec: 3}
	v, err := p.cli.Deploy(ctx, spec, zip)
	if err != nil {
		return 0, fmt.Errorf("deploy %s to %s: %w", name, p.endpoint, err)
	}
	return v.Version, nil
}

// remove deletes the function name; one already gone is no error.
func (p *platform) remove(ctx context.Context, name string) error {
	if err := p.cli.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// removePrefix deletes every function whose name starts with prefix (left
// by an interrupted run of the same benchmark) and returns how many.
func (p *platform) removePrefix(ctx context.Context, prefix string) (int, error) {
	fns, err := p.cli.Functions(ctx)
	if err != nil {
		return 0, fmt.Errorf("list functions: %w", err)
	}
	var names []string
	for _, f := range fns {
		if strings.HasPrefix(f.Name, prefix) {
			names = append(names, f.Name)
		}
	}
	return len(names), p.removeAll(ctx, names)
}

// removeAll deletes names, a few at a time, and returns the first error.
func (p *platform) removeAll(ctx context.Context, names []string) error {
	return forEach(ctx, len(names), 8, func(ctx context.Context, i int) error { return p.remove(ctx, names[i]) })
}

// drop stops the idle instances of name on every worker and, unless
// keepTemplates, its function templates: the next call takes the warm
// path (templates kept) or the cold one.
func (p *platform) drop(ctx context.Context, name string, keepTemplates bool) (api.DropResult, error) {
	res, err := p.cli.DropInstances(ctx, name, 0, keepTemplates)
	if err != nil {
		return res, err
	}
	if res.Workers == 0 {
		// Nothing was dropped anywhere: the next call would not take the
		// path the benchmark means to measure.
		return res, &unavailableError{msg: "DELETE /v1/functions/" + name + "/instances: no worker answered, so the benchmark cannot force a warm or cold start: check GET /v1/workers"}
	}
	return res, nil
}

// workers lists the workers that reported lately.
func (p *platform) workers(ctx context.Context) ([]api.WorkerSummary, error) {
	return p.cli.Workers(ctx)
}

// worker returns one worker's processes and their memory.
func (p *platform) worker(ctx context.Context, id string) (api.WorkerInfo, error) {
	return p.cli.Worker(ctx, id)
}

// allWorkers returns the details of every worker, in the order listed.
func (p *platform) allWorkers(ctx context.Context) ([]api.WorkerInfo, error) {
	ws, err := p.workers(ctx)
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, &unavailableError{msg: "torpor at " + p.endpoint + " lists no worker (GET /v1/workers): is `torpor up` still starting?"}
	}
	out := make([]api.WorkerInfo, 0, len(ws))
	for _, w := range ws {
		info, err := p.worker(ctx, w.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// refused reports whether err is torpor declining work for want of room
// (HTTP 429 or 503), as opposed to a broken call.
func refused(err error) bool {
	return errors.Is(err, errdefs.ErrThrottled) || errors.Is(err, errdefs.ErrUnavailable)
}

// forEach runs fn(i) for i in [0, n) from conc goroutines and returns the
// first error; after one, the remaining indexes are skipped.
func forEach(ctx context.Context, n, conc int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	for w := 0; w < min(conc, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil || i >= n
				mu.Unlock()
				if stop || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		// Only the parent's cancellation gets here: ours follows an error.
		return ctx.Err()
	}
	return first
}

// errorSet keeps up to five distinct error messages and counts them all.
type errorSet struct {
	N        int
	Messages []string
	seen     map[string]bool
}

func (s *errorSet) add(prefix string, err error) {
	if err == nil {
		return
	}
	s.N++
	msg := err.Error()
	if prefix != "" {
		msg = prefix + ": " + msg
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	if !s.seen[msg] && len(s.Messages) < 5 {
		s.seen[msg] = true
		s.Messages = append(s.Messages, msg)
	}
}

// errorGroup is the failures of one series (or phase, or burst).
type errorGroup struct {
	label    string
	failures int
	msgs     []string
}

// printFailures prints how many calls failed over all groups and up to
// five distinct error messages, each with the first group it came from.
func printFailures(w io.Writer, groups []errorGroup) {
	total := 0
	seen := map[string]bool{}
	var lines []string
	for _, g := range groups {
		total += g.failures
		for _, m := range g.msgs {
			if !seen[m] && len(lines) < 5 {
				seen[m] = true
				lines = append(lines, g.label+": "+m)
			}
		}
	}
	if total == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d measured calls failed; distinct errors (up to 5):\n", total)
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// runID is a short token that makes this run's function names unique.
func runID(now time.Time) string {
	return strconv.FormatInt(now.UnixMilli()%(36*36*36*36*36*36), 36)
}

// startsOf counts the X-Torpor-Start values of successful calls.
func startsOf(calls []callResult) map[string]int {
	m := map[string]int{}
	for _, c := range calls {
		if c.err != nil {
			continue
		}
		s := c.start
		if s == "" {
			s = "unknown"
		}
		m[s]++
	}
	return m
}

// startMix formats start-path counts as "hot 90% warm 8% cold 2%", in the
// order of the paths, for a table cell.
func startMix(m map[string]int) string {
	total := 0
	for _, n := range m {
		total += n
	}
	if total == 0 {
		return "-"
	}
	var parts []string
	for _, k := range startPaths(m) {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*float64(m[k])/float64(total)))
	}
	return strings.Join(parts, " ")
}

// startPaths lists the keys of m: the known start paths in order of cost,
// then any other.
func startPaths(m map[string]int) []string {
	var out []string
	known := []string{"hot", "warm", "cold", "restore"}
	for _, k := range known {
		if m[k] > 0 {
			out = append(out, k)
		}
	}
	var rest []string
	for k, n := range m {
		if n > 0 && !slices.Contains(known, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}
