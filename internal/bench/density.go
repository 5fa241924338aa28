package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults of DensityOptions.
const (
	DefaultDensityBudgetMB = 4096
	DefaultDensityMax      = 500
	DefaultDensityPlateau  = 16
	densityPrefix          = "bench-d-"
)

// TargetTemplateUSS is the fast-start work's density target: an idle NOP
// function template keeps at most this much private memory.
const TargetTemplateUSS = 1 << 20

// Process kinds of api.ProcessInfo.
const (
	kindRuntimeTemplate  = "runtime-template"
	kindFunctionTemplate = "function-template"
	kindInstance         = "instance"
)

// DensityOptions configures Density.
type DensityOptions struct {
	PlatformOptions
	// BudgetMB stops the run once the workers' templates and instances
	// add up to this much PSS (MiB).
	BudgetMB int
	// Max is the most functions deployed.
	Max int
	// Plateau stops the run when this many deployments in a row have not
	// raised the number of cached functions: the worker reclaims or
	// refuses as fast as functions come.
	Plateau int
}

func (o *DensityOptions) normalize() error {
	if err := o.PlatformOptions.normalize("density"); err != nil {
		return err
	}
	o.BudgetMB = orDefault(o.BudgetMB, DefaultDensityBudgetMB)
	o.Max = orDefault(o.Max, DefaultDensityMax)
	o.Plateau = orDefault(o.Plateau, DefaultDensityPlateau)
	if o.BudgetMB < 1 || o.Max < 1 || o.Max > 9999 || o.Plateau < 1 {
		return errdefs.Invalid(fmt.Sprintf("bench density: budget %d MiB, max %d, plateau %d: use a budget of 1 MiB or more, --max 1-9999, --plateau 1 or more",
			o.BudgetMB, o.Max, o.Plateau))
	}
	return nil
}

// DensityPoint is the workers' state after one more function was deployed
// and called once.
type DensityPoint struct {
	Deployed  int    `json:"deployed"`
	Function  string `json:"function"`
	LatencyUS int64  `json:"latency_us"` // of its one call
	Start     string `json:"start"`      // X-Torpor-Start of that call
	Error     string `json:"error,omitempty"`
	// Of this run's functions: function templates, idle instances, and
	// functions with either.
	FunctionTemplates int `json:"function_templates"`
	Instances         int `json:"instances"`
	Cached            int `json:"cached"`
	// Over every template and instance of every worker.
	Processes      int     `json:"processes"`
	PSS            int64   `json:"pss"`
	USS            int64   `json:"uss"`
	RSS            int64   `json:"rss"`
	MemAvailableMB int     `json:"mem_available_mb"`
	LowWatermarkMB int     `json:"low_watermark_mb"`
	ElapsedS       float64 `json:"elapsed_s"` // since the first deployment
}

// MemStats is the distribution of one kind of process's memory, bytes.
type MemStats struct {
	N         int   `json:"n"`
	PSSMedian int64 `json:"pss_median"`
	PSSP90    int64 `json:"pss_p90"`
	USSMedian int64 `json:"uss_median"`
	USSP90    int64 `json:"uss_p90"`
	RSSMedian int64 `json:"rss_median"`
}

func memStats(ps []api.ProcessInfo) MemStats {
	var pss, uss, rss []int64
	for _, p := range ps {
		pss, uss, rss = append(pss, p.PSS), append(uss, p.USS), append(rss, p.RSS)
	}
	return MemStats{N: len(ps), PSSMedian: Percentile(pss, 50), PSSP90: Percentile(pss, 90),
		USSMedian: Percentile(uss, 50), USSP90: Percentile(uss, 90), RSSMedian: Percentile(rss, 50)}
}

// DensityReport is the outcome of the density benchmark and the schema of
// its results.json.
type DensityReport struct {
	Kind       string    `json:"kind"` // "density"
	Machine    Machine   `json:"machine"`
	Endpoint   string    `json:"endpoint"`
	BudgetMB   int       `json:"budget_mb"`
	Max        int       `json:"max"`
	Plateau    int       `json:"plateau"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// Baseline is one fresh `python -I -S` idling in a NOP loop after one
	// call: what a function costs when each is its own process.
	Baseline ProcMem `json:"baseline"`
	Workers  int     `json:"workers"`
	// Points has one entry per deployment; Points[0] (deployed 0) is the
	// workers before the first.
	Points     []DensityPoint `json:"points"`
	StopReason string         `json:"stop_reason"`
	// Peak is the point with the most cached functions.
	Peak DensityPoint `json:"peak"`
	// Of this run's functions, at the last point.
	Templates        MemStats `json:"templates"`
	Instances        MemStats `json:"instances"`
	RuntimeTemplates MemStats `json:"runtime_templates"`
	// PerFunctionPSS is the PSS of this run's templates and instances
	// over the functions cached, at the last point: what one more cached
	// function costs.
	PerFunctionPSS int64 `json:"per_function_pss"`
	// Ratios to the baseline process (torpor / baseline).
	RatioTemplateUSS float64 `json:"ratio_template_uss"`
	RatioFunctionPSS float64 `json:"ratio_function_pss"`
	TargetMet        bool    `json:"target_met"` // median template USS <= TargetTemplateUSS
	// Processes are the workers' templates and instances at the last point.
	Processes []api.ProcessInfo `json:"processes"`
	Failures  int               `json:"failures"`
	Errors    []string          `json:"errors,omitempty"`
}

// Density deploys unique NOP functions (bench-d-0001, ...) and calls each
// once, reading the workers' processes and their memory after each, until
// their PSS reaches opts.BudgetMB, the number of cached functions stops
// growing, the worker refuses, or opts.Max functions; it compares the
// memory of a cached function with a process-per-function baseline
// measured in the same run, prints the tables to out, writes the results
// to opts.OutDir and deletes the functions. Failed calls are counted in
// the report, not returned as an error.
func Density(ctx context.Context, opts DensityOptions, out io.Writer) (*DensityReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	p, py, machine, err := opts.start(ctx, "density")
	if err != nil {
		return nil, err
	}
	rep := &DensityReport{Kind: "density", Machine: machine, Endpoint: opts.Endpoint, BudgetMB: opts.BudgetMB,
		Max: opts.Max, Plateau: opts.Plateau, StartedAt: machine.Timestamp}

	if rep.Baseline, err = measureNOPProcess(ctx, py.Path); err != nil {
		return nil, fmt.Errorf("bench density: baseline: %w", err)
	}
	fmt.Fprintf(out, "baseline: one %s -I -S NOP loop process: USS %s MiB, PSS %s MiB, RSS %s MiB\n",
		py.Path, mib(rep.Baseline.USS), mib(rep.Baseline.PSS), mib(rep.Baseline.RSS))

	if n, err := p.removePrefix(ctx, densityPrefix); err != nil {
		return nil, fmt.Errorf("bench density: remove the functions of an earlier run: %w", err)
	} else if n > 0 {
		fmt.Fprintf(out, "deleted %d %s* functions left by an earlier run\n", n, densityPrefix)
	}
	var deployed []string
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := p.removeAll(cctx, deployed); err != nil {
			fmt.Fprintf(out, "cleanup: %v (delete the %s* functions by hand)\n", err, densityPrefix)
		} else if len(deployed) > 0 {
			fmt.Fprintf(out, "deleted the %d functions deployed\n", len(deployed))
		}
	}()

	infos, err := p.allWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench density: %w", err)
	}
	rep.Workers = len(infos)
	rep.Points = append(rep.Points, densityPoint(0, "", infos))
	hc := newHTTPClient(1)
	defer hc.CloseIdleConnections()
	var errs errorSet
	begin := time.Now()
	best, since := 0, 0 // most functions cached so far; deployments since it grew
	fmt.Fprintf(out, "deploying %s0001 ... until %d MiB of PSS, %d functions, or %d deployments without growth\n",
		densityPrefix, opts.BudgetMB, opts.Max, opts.Plateau)
	for i := 1; ; i++ {
		name := fmt.Sprintf("%s%04d", densityPrefix, i)
		if _, err := p.deploy(ctx, name, nopCode); err != nil {
			if refused(err) && best > 0 {
				rep.StopReason = "refused: the deploy of " + name + " was refused: " + err.Error()
				break
			}
			return rep, fmt.Errorf("bench density: %w", err)
		}
		deployed = append(deployed, name)
		r := call(ctx, hc, p.invoke("density", name))
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		if infos, err = p.allWorkers(ctx); err != nil {
			return rep, fmt.Errorf("bench density: %w", err)
		}
		pt := densityPoint(i, name, infos)
		pt.LatencyUS, pt.Start, pt.ElapsedS = r.latency.Microseconds(), r.start, time.Since(begin).Seconds()
		if r.err != nil {
			pt.Error = r.err.Error()
			if (r.status == http.StatusTooManyRequests || r.status == http.StatusServiceUnavailable) && best > 0 {
				rep.Points = append(rep.Points, pt)
				rep.StopReason = "refused: the call of " + name + " was refused: " + pt.Error
				break
			}
			errs.add("", r.err) // the point names the function
		}
		rep.Points = append(rep.Points, pt)
		if i%25 == 0 || i == 1 {
			fmt.Fprintf(out, "%5d deployed: %d cached (%d templates, %d idle instances), %d processes, PSS %s MiB, USS %s MiB, available %d MiB, %.1fs\n",
				i, pt.Cached, pt.FunctionTemplates, pt.Instances, pt.Processes, mib(pt.PSS), mib(pt.USS), pt.MemAvailableMB, pt.ElapsedS)
		}
		if pt.Cached > best {
			best, since = pt.Cached, 0
		} else {
			since++
		}
		switch {
		case pt.PSS >= int64(opts.BudgetMB)<<20:
			rep.StopReason = fmt.Sprintf("budget: the workers' templates and instances reached %s MiB of PSS (--budget-mb %d)", mib(pt.PSS), opts.BudgetMB)
		case pt.LowWatermarkMB > 0 && pt.MemAvailableMB < pt.LowWatermarkMB:
			rep.StopReason = fmt.Sprintf("memory: %d MiB available, below the reclaimer's low watermark of %d MiB", pt.MemAvailableMB, pt.LowWatermarkMB)
		case since >= opts.Plateau:
			rep.StopReason = fmt.Sprintf("plateau: %d deployments without more functions cached (the worker reclaims or refuses)", since)
		case i >= opts.Max:
			rep.StopReason = fmt.Sprintf("max: %d functions deployed (--max)", i)
		}
		if rep.StopReason != "" {
			break
		}
	}
	rep.FinishedAt = opts.Now().UTC()
	rep.Failures, rep.Errors = errs.N, errs.Messages
	rep.finish(infos)

	fmt.Fprintln(out)
	PrintDensityTable(out, rep)
	if opts.OutDir != "" {
		if err := WriteDensityResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,processes.csv,cached.png,memory.png}\n", opts.OutDir)
	}
	return rep, nil
}

// densityPoint counts what the workers hold.
func densityPoint(deployed int, name string, infos []api.WorkerInfo) DensityPoint {
	pt := DensityPoint{Deployed: deployed, Function: name}
	cached := map[string]bool{}
	for i, w := range infos {
		if i == 0 || w.MemAvailableMB < pt.MemAvailableMB {
			pt.MemAvailableMB, pt.LowWatermarkMB = w.MemAvailableMB, w.LowWatermarkMB
		}
		for _, pr := range append(append([]api.ProcessInfo(nil), w.Templates...), w.Instances...) {
			pt.Processes++
			pt.PSS += pr.PSS
			pt.USS += pr.USS
			pt.RSS += pr.RSS
			if !strings.HasPrefix(pr.Function, densityPrefix) {
				continue
			}
			switch {
			case pr.Kind == kindFunctionTemplate:
				pt.FunctionTemplates++
				cached[pr.Function] = true
			case pr.Kind == kindInstance && pr.State == "idle":
				pt.Instances++
				cached[pr.Function] = true
			}
		}
	}
	pt.Cached = len(cached)
	return pt
}

// finish computes the memory statistics of the workers' last state.
func (r *DensityReport) finish(infos []api.WorkerInfo) {
	var tmpl, inst, rt []api.ProcessInfo
	var ours int64
	r.Processes = nil
	for _, w := range infos {
		for _, pr := range append(append([]api.ProcessInfo(nil), w.Templates...), w.Instances...) {
			r.Processes = append(r.Processes, pr)
			mine := strings.HasPrefix(pr.Function, densityPrefix)
			switch {
			case pr.Kind == kindRuntimeTemplate:
				rt = append(rt, pr)
			case mine && pr.Kind == kindFunctionTemplate:
				tmpl = append(tmpl, pr)
				ours += pr.PSS
			case mine && pr.Kind == kindInstance:
				if pr.State == "idle" {
					inst = append(inst, pr)
				}
				ours += pr.PSS
			}
		}
	}
	r.Templates, r.Instances, r.RuntimeTemplates = memStats(tmpl), memStats(inst), memStats(rt)
	for _, pt := range r.Points {
		if pt.Cached > r.Peak.Cached {
			r.Peak = pt
		}
	}
	if last := r.Points[len(r.Points)-1]; last.Cached > 0 {
		r.PerFunctionPSS = ours / int64(last.Cached)
	}
	r.RatioTemplateUSS = Ratio(r.Templates.USSMedian, r.Baseline.USS)
	r.RatioFunctionPSS = Ratio(r.PerFunctionPSS, r.Baseline.PSS)
	r.TargetMet = r.Templates.N > 0 && r.Templates.USSMedian <= TargetTemplateUSS
}

// mib formats bytes as MiB with one decimal (two below 10 MiB).
func mib(n int64) string {
	v := float64(n) / (1 << 20)
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
