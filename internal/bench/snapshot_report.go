package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// SnapshotCell is the medians over the repetitions of one store, data kind
// and size, for both paths.
type SnapshotCell struct {
	Store  string `json:"store"`
	Data   string `json:"data"`
	SizeMB int    `json:"size_mb"`
	// Pipelined and Baseline summarise the successful repetitions.
	Pipelined PathSummary `json:"pipelined"`
	Baseline  PathSummary `json:"baseline"`
	// RatioCheckpoint and RatioRestore are pipelined over baseline (< 1:
	// the pipeline is faster); 0 when either path has no success.
	RatioCheckpoint float64 `json:"ratio_checkpoint"`
	RatioRestore    float64 `json:"ratio_restore"`
}

// PathSummary is the medians of one path's successful runs in a cell.
type PathSummary struct {
	N                    int       `json:"n"`
	Failures             int       `json:"failures"`
	CheckpointMS         float64   `json:"checkpoint_ms"`
	RestoreMS            float64   `json:"restore_ms"`
	DumpMS               float64   `json:"dump_ms"`
	CompressMS           float64   `json:"compress_ms"`
	UploadMS             float64   `json:"upload_ms"`
	DownloadMS           float64   `json:"download_ms"`
	DecompressMS         float64   `json:"decompress_ms"`
	CRIURestoreMS        float64   `json:"criu_restore_ms"`
	RawBytes             int64     `json:"raw_bytes"`
	StoredBytes          int64     `json:"stored_bytes"`
	CheckpointRSSBytes   int64     `json:"checkpoint_rss_bytes"`
	CheckpointWriteBytes int64     `json:"checkpoint_write_bytes"`
	RestoreRSSBytes      int64     `json:"restore_rss_bytes"`
	RestoreWriteBytes    int64     `json:"restore_write_bytes"`
	Stages               StageMBps `json:"stages_mbps"`
}

// StageMBps is the throughput of each stage in MB/s (10^6 bytes): raw
// image bytes over the CRIU, compression and decompression times, stored
// bytes over the transfer times. For the pipelined path the times are
// busy times of stages that run at once, so a stage's figure is what it
// sustained while it worked, not a share of the wall time.
type StageMBps struct {
	Dump        float64 `json:"criu_dump"`
	Compress    float64 `json:"compress"`
	Upload      float64 `json:"upload"`
	Download    float64 `json:"download"`
	Decompress  float64 `json:"decompress"`
	CRIURestore float64 `json:"criu_restore"`
}

// summarizeCells groups runs by store, kind and size, in the order first
// measured.
func summarizeCells(runs []SnapshotRun) []SnapshotCell {
	type key struct {
		store, data string
		size        int
	}
	var order []key
	byKey := map[key]map[string][]SnapshotRun{}
	for _, r := range runs {
		k := key{r.Store, r.Data, r.SizeMB}
		if byKey[k] == nil {
			byKey[k] = map[string][]SnapshotRun{}
			order = append(order, k)
		}
		byKey[k][r.Path] = append(byKey[k][r.Path], r)
	}
	cells := make([]SnapshotCell, 0, len(order))
	for _, k := range order {
		c := SnapshotCell{Store: k.store, Data: k.data, SizeMB: k.size,
			Pipelined: summarizePath(byKey[k][PathPipe]), Baseline: summarizePath(byKey[k][PathBase])}
		if c.Pipelined.N > 0 && c.Baseline.N > 0 {
			c.RatioCheckpoint = c.Pipelined.CheckpointMS / c.Baseline.CheckpointMS
			c.RatioRestore = c.Pipelined.RestoreMS / c.Baseline.RestoreMS
		}
		cells = append(cells, c)
	}
	return cells
}

func summarizePath(runs []SnapshotRun) PathSummary {
	var ok []SnapshotRun
	for _, r := range runs {
		if r.Error == "" {
			ok = append(ok, r)
		}
	}
	s := PathSummary{N: len(ok), Failures: len(runs) - len(ok)}
	if len(ok) == 0 {
		return s
	}
	f := func(get func(SnapshotRun) float64) float64 {
		v := make([]float64, len(ok))
		for i, r := range ok {
			v[i] = get(r)
		}
		return median(v)
	}
	i := func(get func(SnapshotRun) int64) int64 {
		return int64(f(func(r SnapshotRun) float64 { return float64(get(r)) }))
	}
	s.CheckpointMS = f(func(r SnapshotRun) float64 { return r.CheckpointMS })
	s.RestoreMS = f(func(r SnapshotRun) float64 { return r.RestoreMS })
	s.DumpMS = f(func(r SnapshotRun) float64 { return r.DumpMS })
	s.CompressMS = f(func(r SnapshotRun) float64 { return r.CompressMS })
	s.UploadMS = f(func(r SnapshotRun) float64 { return r.UploadMS })
	s.DownloadMS = f(func(r SnapshotRun) float64 { return r.DownloadMS })
	s.DecompressMS = f(func(r SnapshotRun) float64 { return r.DecompressMS })
	s.CRIURestoreMS = f(func(r SnapshotRun) float64 { return r.CRIURestoreMS })
	s.RawBytes = i(func(r SnapshotRun) int64 { return r.RawBytes })
	s.StoredBytes = i(func(r SnapshotRun) int64 { return r.StoredBytes })
	s.CheckpointRSSBytes = i(func(r SnapshotRun) int64 { return r.CheckpointRSSBytes })
	s.CheckpointWriteBytes = i(func(r SnapshotRun) int64 { return r.CheckpointWriteBytes })
	s.RestoreRSSBytes = i(func(r SnapshotRun) int64 { return r.RestoreRSSBytes })
	s.RestoreWriteBytes = i(func(r SnapshotRun) int64 { return r.RestoreWriteBytes })
	s.Stages = StageMBps{
		Dump:        mbps(s.RawBytes, s.DumpMS),
		Compress:    mbps(s.RawBytes, s.CompressMS),
		Upload:      mbps(s.StoredBytes, s.UploadMS),
		Download:    mbps(s.StoredBytes, s.DownloadMS),
		Decompress:  mbps(s.RawBytes, s.DecompressMS),
		CRIURestore: mbps(s.RawBytes, s.CRIURestoreMS),
	}
	return s
}

// median of v (the mean of the middle two for an even count); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// mbps is n bytes over t milliseconds in MB/s; 0 when t is 0.
func mbps(n int64, t float64) float64 {
	if t <= 0 {
		return 0
	}
	return float64(n) / 1e6 / (t / 1000)
}

// checkTargets compares the report with the engine's targets.
func checkTargets(rep *SnapshotReport) []TargetCheck {
	var out []TargetCheck
	add := func(what string, target, got float64) {
		out = append(out, TargetCheck{What: what, TargetMS: target, GotMS: got, Met: got > 0 && got <= target})
	}
	for _, c := range rep.Cells {
		if c.Store == StoreMinIO && c.Data == DataRandom && c.SizeMB == TargetSizeMB && c.Pipelined.N > 0 {
			add(fmt.Sprintf("checkpoint %d MB random to MinIO (median)", TargetSizeMB), millis(TargetCheckpoint), c.Pipelined.CheckpointMS)
			add(fmt.Sprintf("restore %d MB random from MinIO (median)", TargetSizeMB), millis(TargetRestore), c.Pipelined.RestoreMS)
		}
	}
	if n := rep.NOP; n != nil && n.Restore.N > 0 {
		add("restore NOP instance from local store, p50", millis(TargetNOPRestore), float64(n.Restore.P50US)/1000)
		add("restore NOP instance from local store, p99", millis(TargetNOPRestore), float64(n.Restore.P99US)/1000)
	}
	return out
}

// printRun prints one run as a progress line.
func printRun(w io.Writer, r SnapshotRun) {
	head := fmt.Sprintf("%-5s %-6s %5d MB #%d %-9s", r.Store, r.Data, r.SizeMB, r.Rep, r.Path)
	if r.Error != "" {
		first, _, _ := strings.Cut(r.Error, "\n")
		fmt.Fprintf(w, "%s FAILED: %s\n", head, first)
		return
	}
	fmt.Fprintf(w, "%s checkpoint %8.1f ms (dump %7.1f, raw %s MB, stored %s MB)  restore %8.1f ms (criu %7.1f)\n",
		head, r.CheckpointMS, r.DumpMS, mb(r.RawBytes), mb(r.StoredBytes), r.RestoreMS, r.CRIURestoreMS)
}

// mb formats bytes as MB (10^6) with one decimal.
func mb(n int64) string { return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) }

// PrintSnapshotTables prints, per store, the times of both paths with
// their ratios and the stage throughputs, then the NOP restores, the
// targets and the failures.
func PrintSnapshotTables(w io.Writer, rep *SnapshotReport) {
	for _, store := range rep.Stores {
		fmt.Fprintf(w, "store %s: median of %d reps, ms; ratio = pipelined / baseline (< 1: pipelined is faster); +RSS = peak growth of the benchmark process; disk W = bytes written to block devices by it and its children\n", store, rep.Reps)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "data\tMB\tckpt pipe\tckpt base\tratio\trestore pipe\trestore base\tratio\traw MB\tstored MB\t+RSS MB pipe\t+RSS MB base\tdisk W MB pipe\tdisk W MB base\tok pipe/base\t\n")
		for _, c := range rep.Cells {
			if c.Store != store {
				continue
			}
			p, b := c.Pipelined, c.Baseline
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t\n",
				c.Data, c.SizeMB, msOr(p.N, p.CheckpointMS), msOr(b.N, b.CheckpointMS), ratio(c.RatioCheckpoint),
				msOr(p.N, p.RestoreMS), msOr(b.N, b.RestoreMS), ratio(c.RatioRestore),
				mb(p.RawBytes), mb(p.StoredBytes), mb(p.CheckpointRSSBytes), mb(b.CheckpointRSSBytes),
				mb(p.CheckpointWriteBytes), mb(b.CheckpointWriteBytes), p.N, b.N)
		}
		tw.Flush()

		fmt.Fprintf(w, "\nstore %s: stage throughput, MB/s (raw image bytes; upload/download: stored bytes). Baseline: sequential steps; pipelined: busy time of overlapping stages\n", store)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "data\tMB\tpath\tcriu dump\tcompress\tupload\tdownload\tdecompress\tcriu restore\t\n")
		for _, c := range rep.Cells {
			if c.Store != store {
				continue
			}
			for _, ps := range []struct {
				name string
				s    PathSummary
			}{{PathPipe, c.Pipelined}, {PathBase, c.Baseline}} {
				st := ps.s.Stages
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Data, c.SizeMB, ps.name,
					rate(st.Dump), rate(st.Compress), rate(st.Upload), rate(st.Download), rate(st.Decompress), rate(st.CRIURestore))
			}
		}
		tw.Flush()
		for _, c := range rep.Cells {
			if c.Store == store && c.Pipelined.N > 0 && c.Pipelined.CompressMS == 0 {
				fmt.Fprintln(w, "  pipelined compress '-': the service reported 0 busy time for zstd (image.Stats.Compress; its concurrent encoder's output time exceeds its input time)")
				break
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "load average at start: %s; at end: %s (%d CPUs)\n\n", rep.Machine.LoadAvg, rep.LoadAvgEnd, rep.Machine.NProc)

	if n := rep.NOP; n != nil {
		fmt.Fprintf(w, "NOP python instance (allocates nothing; image %s MB raw, %s MB stored), local store:\n", mb(n.RawBytes), mb(n.StoredBytes))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "series\tn\tfailed\tp50 ms\tp90 ms\tp99 ms\tmax ms\tp50/cold\tp99/cold\t\n")
		fmt.Fprintf(tw, "restore\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", n.Restore.N, n.Restore.Failures,
			ms(n.Restore.P50US), ms(n.Restore.P90US), ms(n.Restore.P99US), ms(n.Restore.MaxUS), ratio(n.RatioP50), ratio(n.RatioP99))
		if u := Summarize(n.UncachedRestoreUS, 0, 0); u.N > 0 {
			fmt.Fprintf(tw, "  of which uncached\t%d\t-\t%s\t%s\t%s\t%s\t-\t-\t\n", u.N, ms(u.P50US), ms(u.P90US), ms(u.P99US), ms(u.MaxUS))
		}
		crit := Summarize(n.CRIURestoreUS, 0, 0)
		fmt.Fprintf(tw, "  of which criu restore\t%d\t-\t%s\t%s\t%s\t%s\t-\t-\t\n", crit.N, ms(crit.P50US), ms(crit.P90US), ms(crit.P99US), ms(crit.MaxUS))
		fmt.Fprintf(tw, "cold start (baseline)\t%d\t%d\t%s\t%s\t%s\t%s\t-\t-\t\n", n.ColdStart.N, n.ColdStart.Failures,
			ms(n.ColdStart.P50US), ms(n.ColdStart.P90US), ms(n.ColdStart.P99US), ms(n.ColdStart.MaxUS))
		tw.Flush()
		fmt.Fprintln(w)
	}

	if len(rep.Targets) > 0 {
		fmt.Fprintln(w, "targets:")
		for _, t := range rep.Targets {
			verdict := "MISSED"
			if t.Met {
				verdict = "met"
			}
			fmt.Fprintf(w, "  %-50s %9.1f ms  target <= %6.0f ms  %s (x%.1f of target)\n", t.What, t.GotMS, t.TargetMS, verdict, t.GotMS/t.TargetMS)
		}
	}

	seen := map[string]bool{}
	for _, r := range rep.Runs {
		if r.Error == "" || seen[r.Error] {
			continue
		}
		seen[r.Error] = true
		fmt.Fprintf(w, "\nFAILED %s %s %d MB #%d %s:\n  %s\n", r.Store, r.Data, r.SizeMB, r.Rep, r.Path, strings.ReplaceAll(r.Error, "\n", "\n  "))
	}
	if n := rep.NOP; n != nil {
		for _, e := range n.Errors {
			fmt.Fprintf(w, "\nFAILED NOP: %s\n", e)
		}
	}
}

func msOr(n int, v float64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func rate(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// WriteSnapshotResults writes results.json (the report), results.csv (one
// row per run), checkpoint.png and restore.png (median time against size,
// one line per path, data kind and store) and, with a NOP result, nop.png
// (the CDF of its restores and cold starts) to dir.
func WriteSnapshotResults(dir string, rep *SnapshotReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir %s: %w", dir, err)
	}
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if err := writeFile(filepath.Join(dir, "results.csv"), func(w *bufio.Writer) error { return writeSnapshotCSV(w, rep) }); err != nil {
		return err
	}
	for _, p := range []struct {
		file, what string
		get        func(PathSummary) float64
	}{
		{"checkpoint.png", "checkpoint", func(s PathSummary) float64 { return s.CheckpointMS }},
		{"restore.png", "restore", func(s PathSummary) float64 { return s.RestoreMS }},
	} {
		lines := snapshotPlotLines(rep, p.get)
		title := fmt.Sprintf("torpor snapshot %s time vs instance size, median of %d; %d cpu %s, %s",
			p.what, rep.Reps, rep.Machine.NProc, shortCPU(rep.Machine.CPUModel), rep.StartedAt.Format("2006-01-02 15:04Z"))
		err := writeFile(filepath.Join(dir, p.file), func(w *bufio.Writer) error {
			return renderXY(w, title, "instance data (MB, log scale)", p.what+" time (ms, log scale)", lines)
		})
		if err != nil {
			return err
		}
	}
	if n := rep.NOP; n != nil && (len(n.RestoreUS) > 0 || len(n.ColdStartUS) > 0) {
		lines := []PlotLine{
			{Label: fmt.Sprintf("restore from local store  p50 %s p99 %s ms", ms3(n.Restore.P50US), ms3(n.Restore.P99US)), LatenciesUS: n.RestoreUS, Color: Palette[0]},
			{Label: fmt.Sprintf("cold start (baseline)     p50 %s p99 %s ms", ms3(n.ColdStart.P50US), ms3(n.ColdStart.P99US)), LatenciesUS: n.ColdStartUS, Color: Palette[9]},
		}
		title := fmt.Sprintf("torpor restore of a NOP python instance vs its cold start, %d each; %s", len(n.RestoreUS), rep.StartedAt.Format("2006-01-02 15:04Z"))
		if err := writeFile(filepath.Join(dir, "nop.png"), func(w *bufio.Writer) error { return RenderCDF(w, title, lines) }); err != nil {
			return err
		}
	}
	return nil
}

var snapshotCSVHeader = []string{"store", "data", "size_mb", "rep", "path",
	"checkpoint_ms", "dump_ms", "archive_ms", "compress_ms", "upload_ms", "raw_bytes", "stored_bytes", "checkpoint_rss_bytes", "checkpoint_write_bytes",
	"restore_ms", "download_ms", "decompress_ms", "extract_ms", "criu_restore_ms", "restore_rss_bytes", "restore_write_bytes", "restored_rss_bytes", "ok"}

func writeSnapshotCSV(w *bufio.Writer, rep *SnapshotReport) error {
	if _, err := w.WriteString(strings.Join(snapshotCSVHeader, ",") + "\n"); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range rep.Runs {
		row := []string{r.Store, r.Data, strconv.Itoa(r.SizeMB), strconv.Itoa(r.Rep), r.Path,
			f(r.CheckpointMS), f(r.DumpMS), f(r.ArchiveMS), f(r.CompressMS), f(r.UploadMS),
			strconv.FormatInt(r.RawBytes, 10), strconv.FormatInt(r.StoredBytes, 10),
			strconv.FormatInt(r.CheckpointRSSBytes, 10), strconv.FormatInt(r.CheckpointWriteBytes, 10),
			f(r.RestoreMS), f(r.DownloadMS), f(r.DecompressMS), f(r.ExtractMS), f(r.CRIURestoreMS),
			strconv.FormatInt(r.RestoreRSSBytes, 10), strconv.FormatInt(r.RestoreWriteBytes, 10), strconv.FormatInt(r.RestoredRSSBytes, 10),
			strconv.FormatBool(r.Error == "")}
		if _, err := w.WriteString(strings.Join(row, ",") + "\n"); err != nil {
			return err
		}
	}
	return nil
}

// snapshotPlotLines makes one line per path, data kind and store: colour
// by store and kind, solid for the pipeline, dashed for the baseline.
func snapshotPlotLines(rep *SnapshotReport, get func(PathSummary) float64) []xyLine {
	var lines []xyLine
	ci := 0
	for _, store := range rep.Stores {
		for _, kind := range rep.Kinds {
			for _, path := range []string{PathPipe, PathBase} {
				l := xyLine{Label: fmt.Sprintf("%-9s %-6s %s", path, kind, store), Color: Palette[ci%len(Palette)], Dash: DashSolid}
				if path == PathBase {
					l.Dash = DashDashed
				}
				for _, c := range rep.Cells {
					s := c.Pipelined
					if path == PathBase {
						s = c.Baseline
					}
					if c.Store == store && c.Data == kind && s.N > 0 {
						l.X = append(l.X, float64(c.SizeMB))
						l.Y = append(l.Y, get(s))
					}
				}
				lines = append(lines, l)
			}
			ci++
		}
	}
	return lines
}
