package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/client"
	"github.com/torpor-dev/torpor/internal/codezip"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/miniosrv"
)

// The eviction benchmark (`torpor bench evict`): call migration measured
// on a real process cluster (StartCluster) through the public API, in
// three parts shaped after R-Check's evaluation — the cost of moving N
// concurrent calls (§5.7), exactly-once execution under random evictions,
// and the overhead of evictions on a workload (Fig 5.7) against re-running
// killed calls and against periodic (Kappa-style) checkpoints.

// Parts of the eviction benchmark.
const (
	EvictPartConcurrency = "concurrency"
	EvictPartOnce        = "exactly-once"
	EvictPartOverhead    = "overhead"
)

// EvictParts are the parts, in the order they run.
var EvictParts = []string{EvictPartConcurrency, EvictPartOnce, EvictPartOverhead}

// Defaults of EvictOptions.
var (
	DefaultEvictN     = []int{1, 2, 4, 8, 16}
	DefaultEvictRates = []float64{1, 5, 10, 15, 20}
)

// Defaults of EvictOptions.
const (
	DefaultEvictMB          = 50
	DefaultEvictCallSeconds = 20
	DefaultEvictGrace       = 60 * time.Second
	DefaultEvictTrials      = 1000
	DefaultEvictBatch       = 8
	DefaultEvictCalls       = 1000
	DefaultEvictConcurrency = 8
	DefaultEvictTimeScale   = 1
	DefaultEvictSeed        = 1
)

// EvictOptions configures Evict.
type EvictOptions struct {
	Parts  []string
	OutDir string
	// Binary is the torpor binary the cluster runs (default
	// os.Executable()); torpor-init must be beside it.
	Binary string
	// Store is "local" (a directory in OutDir) or "minio" (a MinIO this
	// benchmark starts, its data in OutDir); MinIO is its binary.
	Store string
	MinIO string

	// Part concurrency.
	N           []int
	MB          int
	CallSeconds float64
	Grace       time.Duration

	// Part exactly-once.
	Trials int
	Batch  int

	// Part overhead.
	Calls       int
	Rates       []float64 // percent of calls hit by an eviction
	Concurrency int
	TimeScale   float64
	Seed        uint64

	// Log receives progress messages and the cluster harness's; nil
	// discards them.
	Log *slog.Logger
}

func (o *EvictOptions) normalize() error {
	if len(o.Parts) == 0 {
		o.Parts = EvictParts
	}
	for _, p := range o.Parts {
		if !slices.Contains(EvictParts, p) {
			return errdefs.Invalid(fmt.Sprintf("bench evict: unknown part %q: use %s", p, strings.Join(EvictParts, ", ")))
		}
	}
	if o.OutDir == "" {
		return errdefs.Invalid("bench evict: no output directory")
	}
	if o.Store == "" {
		o.Store = StoreLocal
	}
	if o.Store != StoreLocal && o.Store != StoreMinIO {
		return errdefs.Invalid(fmt.Sprintf("bench evict: unknown store %q: use local or minio", o.Store))
	}
	if len(o.N) == 0 {
		o.N = DefaultEvictN
	}
	for _, n := range o.N {
		if n < 1 || n > 64 {
			return errdefs.Invalid(fmt.Sprintf("bench evict: --n %d: use 1-64", n))
		}
	}
	o.MB = orDefault(o.MB, DefaultEvictMB)
	if o.CallSeconds == 0 {
		o.CallSeconds = DefaultEvictCallSeconds
	}
	if o.Grace == 0 {
		o.Grace = DefaultEvictGrace
	}
	o.Trials = orDefault(o.Trials, DefaultEvictTrials)
	o.Batch = orDefault(o.Batch, DefaultEvictBatch)
	o.Calls = orDefault(o.Calls, DefaultEvictCalls)
	o.Concurrency = orDefault(o.Concurrency, DefaultEvictConcurrency)
	if len(o.Rates) == 0 {
		o.Rates = DefaultEvictRates
	}
	for _, r := range o.Rates {
		if !(r > 0 && r <= 100) {
			return errdefs.Invalid(fmt.Sprintf("bench evict: --rates %g: use percentages in (0, 100]", r))
		}
	}
	if o.TimeScale == 0 {
		o.TimeScale = DefaultEvictTimeScale
	}
	if o.Seed == 0 {
		o.Seed = DefaultEvictSeed
	}
	switch {
	case o.MB < 1 || o.MB > 1024:
		return errdefs.Invalid(fmt.Sprintf("bench evict: --mb %d: use 1-1024", o.MB))
	case o.CallSeconds < 1:
		return errdefs.Invalid(fmt.Sprintf("bench evict: --call-seconds %g: use 1 or more", o.CallSeconds))
	case o.Grace < time.Second:
		return errdefs.Invalid(fmt.Sprintf("bench evict: --grace %s: use 1s or more", o.Grace))
	case o.Trials < 1 || o.Batch < 1 || o.Calls < 1 || o.Concurrency < 1:
		return errdefs.Invalid("bench evict: --trials, --batch, --calls and --concurrency must be 1 or more")
	case !(o.TimeScale > 0 && o.TimeScale <= 1):
		return errdefs.Invalid(fmt.Sprintf("bench evict: --time-scale %g: use (0, 1]", o.TimeScale))
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// EvictReport is the outcome of the eviction benchmark and the schema of
// its results.json. A part that did not run is nil.
type EvictReport struct {
	Kind        string               `json:"kind"` // "evict"
	Machine     Machine              `json:"machine"`
	Store       string               `json:"store"`
	StartedAt   time.Time            `json:"started_at"`
	FinishedAt  time.Time            `json:"finished_at"`
	Concurrency *EvictConcurrencyRun `json:"concurrency,omitempty"`
	Once        *EvictOnceRun        `json:"exactly_once,omitempty"`
	Overhead    *EvictOverheadRun    `json:"overhead,omitempty"`
}

// Failures returns the number of calls that failed or answered wrongly,
// and exactly-once mismatches: any makes the command exit 1.
func (r *EvictReport) Failures() int {
	n := 0
	if r.Concurrency != nil {
		for _, s := range r.Concurrency.Steps {
			n += s.Failures
		}
	}
	if r.Once != nil {
		n += r.Once.Mismatches + r.Once.Failures
	}
	if r.Overhead != nil {
		n += r.Overhead.Failures
	}
	return n
}

// Evict runs the parts of opts, prints their tables to out and writes the
// raw results and plots to opts.OutDir. A part that cannot run (the
// cluster does not start) ends the benchmark with an error; failed calls
// and mismatches are counted in the report (Failures).
func Evict(ctx context.Context, opts EvictOptions, out io.Writer) (*EvictReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	if opts.Binary == "" {
		bin, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bench evict: find the torpor binary: %w", err)
		}
		opts.Binary = bin
	}
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("bench evict: %w", err)
	}
	env, err := openEvictStore(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer env.stop()
	rep := &EvictReport{Kind: "evict", Machine: probeMachine(ctx, "python3", time.Now().UTC()), Store: env.describe}
	rep.StartedAt = rep.Machine.Timestamp
	fmt.Fprintf(out, "bench evict: %s; torpor %s; results in %s\n", env.describe, opts.Binary, opts.OutDir)
	save := func() error {
		rep.FinishedAt = time.Now().UTC()
		return writeEvictResults(opts.OutDir, rep)
	}
	for _, part := range opts.Parts {
		var err error
		switch part {
		case EvictPartConcurrency:
			rep.Concurrency, err = evictConcurrency(ctx, opts, env, out)
			if rep.Concurrency != nil {
				printEvictConcurrency(out, rep.Concurrency)
			}
		case EvictPartOnce:
			rep.Once, err = evictOnce(ctx, opts, env, out)
			if rep.Once != nil {
				printEvictOnce(out, rep.Once)
			}
		case EvictPartOverhead:
			rep.Overhead, err = evictOverhead(ctx, opts, env, out)
			if rep.Overhead != nil {
				printEvictOverhead(out, rep.Overhead)
			}
		}
		if serr := save(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return rep, fmt.Errorf("bench evict: %s: %w", part, err)
		}
	}
	fmt.Fprintf(out, "\nresults: %s\n", opts.OutDir)
	return rep, nil
}

// evictEnv is the snapshot store every cluster of the run shares.
type evictEnv struct {
	store    string     // --snapshot-store; "" is each cluster's own directory
	state    blob.Store // the same store, for the Kappa-style baseline's saved states
	env      []string   // for every process
	describe string
	stop     func()
}

func openEvictStore(ctx context.Context, opts EvictOptions) (*evictEnv, error) {
	if opts.Store == StoreLocal {
		state, err := localdir.New(filepath.Join(opts.OutDir, "kappa-state"))
		if err != nil {
			return nil, fmt.Errorf("bench evict: %w", err)
		}
		return &evictEnv{state: state, describe: "snapshot store: a local directory in each cluster's dir (" + fsType(opts.OutDir) + ")",
			stop: func() { _ = os.RemoveAll(filepath.Join(opts.OutDir, "kappa-state")) }}, nil
	}
	bin := opts.MinIO
	if bin == "" {
		var why string
		if bin, why = miniosrv.Binary(); bin == "" {
			return nil, fmt.Errorf("bench evict: %s, pass --minio PATH, or use --store local", why)
		}
	}
	dir, err := filepath.Abs(filepath.Join(opts.OutDir, "minio"))
	if err != nil {
		return nil, err
	}
	srv, err := miniosrv.Start(ctx, bin, dir)
	if err != nil {
		return nil, fmt.Errorf("bench evict: %w", err)
	}
	const bucket = "torpor-evict"
	st, err := s3store.New(ctx, s3store.Config{Endpoint: srv.Endpoint, Bucket: bucket,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PathStyle: true})
	if err == nil {
		err = st.EnsureBucket(ctx)
	}
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("bench evict: MinIO at %s: %w", srv.Endpoint, err)
	}
	return &evictEnv{
		store:    "s3://" + bucket + "?endpoint=" + url.QueryEscape(srv.Endpoint) + "&path_style=true",
		state:    st,
		env:      []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey},
		describe: "snapshot store: MinIO at " + srv.Endpoint + " (its data in " + dir + ")",
		stop:     srv.Stop,
	}, nil
}

// evictCluster starts the two-worker cluster of one part in
// OutDir/<part>, where its logs stay.
func evictCluster(ctx context.Context, opts EvictOptions, env *evictEnv, part string, grace time.Duration, gatewayExtra ...string) (*Cluster, *client.Client, error) {
	dir := filepath.Join(opts.OutDir, part)
	c, err := StartCluster(ctx, ClusterConfig{
		Binary: opts.Binary, Dir: dir, Workers: 2, Store: env.store, Env: env.env, Log: opts.Log,
		Extra:        []string{"--sandbox-network=host", "--templates=false", "--eviction-grace=" + grace.String()},
		GatewayExtra: gatewayExtra,
	})
	if err != nil {
		return nil, nil, err
	}
	cli, err := client.New(c.Endpoint(), client.WithHTTPClient(&http.Client{Timeout: 30 * time.Minute}))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, cli, nil
}

// closeEvictCluster stops c and removes its local snapshot directory (the
// images of moved calls), keeping the logs.
func closeEvictCluster(c *Cluster, opts EvictOptions, part string) {
	c.Close()
	_ = os.RemoveAll(filepath.Join(opts.OutDir, part, "snapshots"))
}

// deployEvict deploys code as app.py under spec.
func deployEvict(ctx context.Context, cli *client.Client, spec function.Spec, code string) error {
	zip, err := codezip.FromFiles(map[string]string{"app.py": code})
	if err != nil {
		return err
	}
	spec.Runtime, spec.Handler = "python3", "app.handler"
	if _, err := cli.Deploy(ctx, spec, zip); err != nil {
		return fmt.Errorf("deploy %s: %w", spec.Name, err)
	}
	return nil
}

// memoryFor is the memory limit of a function holding mb MB: the data,
// the interpreter and headroom, rounded up to 64 MB.
func memoryFor(mb int) int {
	m := mb + 128
	return (m + 63) / 64 * 64
}

// memCode is the function of the concurrency part: it holds mb MB of
// random bytes (incompressible, like the 50 MB a compression function
// holds in R-Check §5.7: every page is dumped, stored and restored in
// full), then sleeps steps × step_ms, in steps so that a restored call's
// remaining sleep is short, and answers whether its memory came through
// intact.
const memCode = `import hashlib, os, time
def handler(e, c):
    buf = os.urandom(e["mb"] << 20)
    digest = hashlib.sha256(buf).digest()
    for _ in range(e["steps"]):
        time.sleep(e["step_ms"] / 1000)
    return {"i": e["i"], "steps": e["steps"], "mb": len(buf) >> 20, "intact": hashlib.sha256(buf).digest() == digest}
`

// memResult is memCode's answer.
type memResult struct {
	I      int  `json:"i"`
	Steps  int  `json:"steps"`
	MB     int  `json:"mb"`
	Intact bool `json:"intact"`
}

func (r memResult) check(i, steps, mb int) error {
	if r.I != i || r.Steps != steps || r.MB != mb || !r.Intact {
		return fmt.Errorf("result %+v, want call %d, %d steps, %d MB intact", r, i, steps, mb)
	}
	return nil
}

// hopStats are what a call's record says about its moves.
type hopStats struct {
	Checkpoints  int       // attempts that ended checkpointed (any reason)
	Evicted      int       // ... because of an eviction
	Lost         int       // attempts lost with their worker (re-run or resumed from an older checkpoint)
	Resumes      int       // attempts that started from a checkpoint
	CheckpointMS []float64 // of eviction checkpoints
	RestoreMS    []float64 // of resumes
	ImageBytes   []int64
}

func hops(c function.Call) hopStats {
	var h hopStats
	for _, a := range c.Attempts {
		switch a.Outcome {
		case function.OutcomeCheckpointed:
			h.Checkpoints++
			if a.Reason == function.ReasonEviction {
				h.Evicted++
				h.CheckpointMS = append(h.CheckpointMS, a.CheckpointMS)
				h.ImageBytes = append(h.ImageBytes, a.ImageBytes)
			}
		case function.OutcomeLost:
			h.Lost++
		}
		if a.Start == function.StartResume {
			h.Resumes++
			h.RestoreMS = append(h.RestoreMS, a.RestoreMS)
		}
	}
	return h
}

// hit reports whether an eviction struck the call: it was checkpointed
// because of one, or lost with its worker.
func (h hopStats) hit() bool { return h.Evicted > 0 || h.Lost > 0 }

// finalRecord polls the record of call id until it holds the call's
// outcome, for up to 10 s: the worker writes a sync call's record after
// it answers.
func finalRecord(ctx context.Context, cli *client.Client, id string) (function.Call, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := cli.Call(ctx, id)
		if err == nil && (c.Status == function.StatusSucceeded || c.Status == function.StatusFailed) {
			return c, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("call %s: record still %s after 10 s", id, c.Status)
			}
			return c, err
		}
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitRunning polls GET /v1/workers/{id} until the worker runs n calls.
func waitRunning(ctx context.Context, cli *client.Client, id string, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := -1
	for {
		if w, err := cli.Worker(ctx, id); err == nil {
			last = w.Running
			if last >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worker %s runs %d calls after %s, want %d: %w", id, last, timeout, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// floatPercentile is Percentile over float64 values (nearest rank).
func floatPercentile(values []float64, p float64) float64 {
	if len(values) == 0 {
		return 0
	}
	s := slices.Clone(values)
	slices.Sort(s)
	rank := int(float64(len(s))*p/100 + 0.999999999)
	return s[max(1, min(len(s), rank))-1]
}

// pct formats a fraction as a percentage.
func pct(f float64) string { return fmt.Sprintf("%+.1f%%", 100*f) }
