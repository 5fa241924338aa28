package bench

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"text/tabwriter"
)

// PrintDensityTable prints how many functions the workers cached, what one
// costs against a process-per-function baseline, and the target.
func PrintDensityTable(w io.Writer, rep *DensityReport) {
	last := rep.Points[len(rep.Points)-1]
	fmt.Fprintf(w, "stopped: %s\n", rep.StopReason)
	fmt.Fprintf(w, "deployed %d functions on %d worker(s): %d cached at the end (%d function templates, %d idle instances), %d at the peak (deployment %d)\n",
		last.Deployed, rep.Workers, last.Cached, last.FunctionTemplates, last.Instances, rep.Peak.Cached, rep.Peak.Deployed)
	fmt.Fprintf(w, "every template and instance of the workers: %d processes, PSS %s MiB, USS %s MiB; %d MiB available\n\n",
		last.Processes, mib(last.PSS), mib(last.USS), last.MemAvailableMB)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-34s\tn\tUSS p50\tUSS p90\tPSS p50\tPSS p90\tRSS p50\tUSS/base\tPSS/base\t\n", "process (MiB)")
	row := func(name string, m MemStats) {
		fmt.Fprintf(tw, "%-34s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, m.N, mib(m.USSMedian), mib(m.USSP90),
			mib(m.PSSMedian), mib(m.PSSP90), mib(m.RSSMedian), ratioSig(Ratio(m.USSMedian, rep.Baseline.USS)), ratioSig(Ratio(m.PSSMedian, rep.Baseline.PSS)))
	}
	b := rep.Baseline
	fmt.Fprintf(tw, "%-34s\t1\t%s\t-\t%s\t-\t%s\t-\t-\t\n", "baseline: python -I -S NOP process", mib(b.USS), mib(b.PSS), mib(b.RSS))
	row("function template (idle NOP)", rep.Templates)
	row("idle instance", rep.Instances)
	row("runtime template", rep.RuntimeTemplates)
	tw.Flush()

	fmt.Fprintf(w, "\nPSS per cached function (its templates and instances / functions cached): %s MiB = %s the baseline's %s MiB",
		mib(rep.PerFunctionPSS), ratioSig(rep.RatioFunctionPSS), mib(b.PSS))
	if rep.PerFunctionPSS > 0 {
		fmt.Fprintf(w, ": %d functions per GiB against %d for a process per function", (1<<30)/rep.PerFunctionPSS, (1<<30)/max(b.PSS, 1))
	}
	fmt.Fprintln(w)
	met := "MISSED"
	if rep.TargetMet {
		met = "met"
	}
	fmt.Fprintf(w, "target: <= %s MiB private (USS) per idle NOP function template: median %s MiB, %s\n",
		mib(TargetTemplateUSS), mib(rep.Templates.USSMedian), met)
	printFailures(w, []errorGroup{{"density", rep.Failures, rep.Errors}})
}

// WriteDensityResults writes results.json (the report), results.csv (one
// row per deployment), processes.csv (the workers' processes at the end),
// cached.png and memory.png to dir.
func WriteDensityResults(dir string, rep *DensityReport) error {
	var x, tmpl, inst, cached, pss, uss, base, budget []float64
	for _, pt := range rep.Points {
		x = append(x, float64(pt.Deployed))
		tmpl, inst, cached = append(tmpl, float64(pt.FunctionTemplates)), append(inst, float64(pt.Instances)), append(cached, float64(pt.Cached))
		pss, uss = append(pss, float64(pt.PSS)/(1<<20)), append(uss, float64(pt.USS)/(1<<20))
		base = append(base, float64(int64(pt.Deployed)*rep.Baseline.PSS)/(1<<20))
		budget = append(budget, float64(rep.BudgetMB))
	}
	title := "torpor density: unique NOP functions deployed and called once; " + machineLine(rep.Machine)
	xa := chartAxis{Label: "functions deployed"}
	counts := chart{Title: title, X: xa, Y: chartAxis{Label: "cached on the workers"}, Series: []chartSeries{
		{Label: "functions cached (template or idle instance)", X: x, Y: cached, Color: Palette[9], Line: true},
		{Label: "function templates", X: x, Y: tmpl, Color: Palette[0], Line: true, Dash: DashDashed},
		{Label: "idle instances", X: x, Y: inst, Color: Palette[1], Line: true, Dash: DashDotted},
	}}
	mem := chart{Title: title, X: xa, Y: chartAxis{Label: "MiB, all templates and instances"}, Series: []chartSeries{
		{Label: "torpor PSS", X: x, Y: pss, Color: Palette[0], Line: true},
		{Label: "torpor USS", X: x, Y: uss, Color: Palette[2], Line: true},
		{Label: fmt.Sprintf("baseline: a %s MiB process per function (PSS)", mib(rep.Baseline.PSS)), X: x, Y: base, Color: Palette[9], Line: true, Dash: DashDashed},
	}}
	// The budget line only where it is in reach: else it flattens the rest.
	if top := max(slices.Max(pss), slices.Max(base)); top >= float64(rep.BudgetMB)/4 {
		mem.Series = append(mem.Series, chartSeries{Label: "--budget-mb", X: x, Y: budget, Color: Palette[3], Line: true, Dash: DashDotted})
	}
	if err := writeResults(dir, rep, func(w *bufio.Writer) error {
		w.WriteString("deployed,function,latency_us,start,ok,function_templates,instances,cached,processes,pss_bytes,uss_bytes,rss_bytes,mem_available_mb,elapsed_s\n")
		for _, pt := range rep.Points {
			fmt.Fprintf(w, "%d,%s,%d,%s,%t,%d,%d,%d,%d,%d,%d,%d,%d,%.3f\n", pt.Deployed, pt.Function, pt.LatencyUS, pt.Start, pt.Error == "",
				pt.FunctionTemplates, pt.Instances, pt.Cached, pt.Processes, pt.PSS, pt.USS, pt.RSS, pt.MemAvailableMB, pt.ElapsedS)
		}
		return nil
	}, map[string]func(io.Writer) error{
		"cached.png": func(w io.Writer) error { return renderChart(w, counts) },
		"memory.png": func(w io.Writer) error { return renderChart(w, mem) },
	}); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "processes.csv"), func(w *bufio.Writer) error {
		w.WriteString("kind,function,version,runtime,id,pid,state,start,rss_bytes,pss_bytes,uss_bytes\n")
		for _, p := range rep.Processes {
			fmt.Fprintf(w, "%s,%s,%d,%s,%s,%d,%s,%s,%d,%d,%d\n", p.Kind, p.Function, p.Version, p.Runtime, p.ID, p.Pid, p.State, p.Start, p.RSS, p.PSS, p.USS)
		}
		return nil
	})
}
