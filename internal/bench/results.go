package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteWarmResults writes the raw results of rep to dir (created if
// needed): results.json (the report, every latency included),
// results.csv (one row per measured call: series, concurrency, i — the
// call's issue order —, latency_us, ok) and latency.png (the CDF plot).
func WriteWarmResults(dir string, rep *WarmReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir %s: %w", dir, err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if err := writeFile(filepath.Join(dir, "results.csv"), func(w *bufio.Writer) error { return writeWarmCSV(w, rep) }); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "latency.png"), func(w *bufio.Writer) error {
		return RenderCDF(w, warmTitle(rep), warmPlotLines(rep))
	})
}

func writeFile(path string, fill func(*bufio.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	w := bufio.NewWriter(f)
	err = fill(w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeWarmCSV(w *bufio.Writer, rep *WarmReport) error {
	if _, err := w.WriteString("series,concurrency,i,latency_us,ok\n"); err != nil {
		return err
	}
	for _, s := range rep.Results {
		for i, c := range s.calls {
			fmt.Fprintf(w, "%s,%d,%d,%d,%t\n", s.Series, s.Concurrency, i, c.latency.Microseconds(), c.err == nil)
		}
	}
	return nil
}

// seriesColor gives each series one colour across concurrencies.
var seriesColor = map[string]color.RGBA{
	SeriesBaseline:     Palette[9], // dark grey: the reference
	SeriesTorporREST:   Palette[0],
	SeriesTorporLambda: Palette[1],
}

func warmPlotLines(rep *WarmReport) []PlotLine {
	dash := map[int]int{}
	for i, c := range rep.Concurrency {
		dash[c] = i % numDashes
	}
	var lines []PlotLine
	for _, s := range rep.Results {
		lines = append(lines, PlotLine{
			Label:       fmt.Sprintf("%-20s c=%-2d p50 %-5s p99 %s ms", s.Series, s.Concurrency, ms3(s.P50US), ms3(s.P99US)),
			LatenciesUS: s.LatenciesUS,
			Color:       seriesColor[s.Series],
			Dash:        dash[s.Concurrency],
		})
	}
	return lines
}

func warmTitle(rep *WarmReport) string {
	m := rep.Machine
	t := "torpor warm calls of a NOP python function, " + strconv.Itoa(rep.Calls) + " calls/line; " +
		strconv.Itoa(m.NProc) + " cpu " + shortCPU(m.CPUModel) + ", " + m.Timestamp.Format("2006-01-02 15:04Z")
	if max := (PlotWidth - 20) / face.Advance; len(t) > max {
		t = t[:max]
	}
	return t
}

// shortCPU trims the marketing noise off a CPU model name.
func shortCPU(s string) string {
	for _, junk := range []string{"(R)", "(TM)", "(tm)", " CPU", " Processor"} {
		s = strings.ReplaceAll(s, junk, "")
	}
	if i := strings.Index(s, " @"); i > 0 {
		s = s[:i]
	}
	return strings.Join(strings.Fields(s), " ")
}

// ms3 formats microseconds as milliseconds with about three significant
// digits, to keep legend labels short.
func ms3(us int64) string {
	v := float64(us) / 1000
	prec := 3
	switch {
	case v >= 100:
		prec = 0
	case v >= 10:
		prec = 1
	case v >= 1:
		prec = 2
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// writeResults writes a benchmark's raw results to dir (created if
// needed): results.json (rep), results.csv (filled by csv) and each plot,
// by file name. The JSON and CSV are written first, so that a plot that
// cannot be drawn (every call failed) does not cost the raw data.
func writeResults(dir string, rep any, csv func(*bufio.Writer) error, plots map[string]func(io.Writer) error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir %s: %w", dir, err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if err := writeFile(filepath.Join(dir, "results.csv"), csv); err != nil {
		return err
	}
	names := slices.Sorted(maps.Keys(plots))
	var errs []error
	for _, name := range names {
		draw := plots[name]
		if err := writeFile(filepath.Join(dir, name), func(w *bufio.Writer) error { return draw(w) }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// callCSVColumns are the columns callCSVFields fills.
const callCSVColumns = "latency_us,ok,start,server_start_us,server_handler_us"

// callCSVFields formats one call for a CSV row: client latency, success,
// X-Torpor-Start and Server-Timing (empty when absent).
func callCSVFields(c callResult) string {
	us := func(d time.Duration) string {
		if d < 0 {
			return ""
		}
		return strconv.FormatInt(d.Microseconds(), 10)
	}
	return fmt.Sprintf("%d,%t,%s,%s,%s", c.latency.Microseconds(), c.err == nil, c.start, us(c.serverStart), us(c.serverHandler))
}

// machineLine is the short description of m that plot titles end with.
func machineLine(m Machine) string {
	return strconv.Itoa(m.NProc) + " cpu " + shortCPU(m.CPUModel) + ", " + m.Timestamp.Format("2006-01-02 15:04Z")
}
