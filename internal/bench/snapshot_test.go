package bench

import (
	"bufio"
	"bytes"
	"image/png"
	"slices"
	"strings"
	"testing"
)

func TestParseStatusField(t *testing.T) {
	status := []byte("Name:\tpython3\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n")
	io := []byte("rchar: 10\nwchar: 20\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n")
	for _, tc := range []struct {
		name  string
		b     []byte
		field string
		want  int64
		err   bool
	}{
		{"kB scaled", status, "VmRSS:", 10240 << 10, false},
		{"first match only", status, "VmHWM:", 20480 << 10, false},
		{"plain number", io, "write_bytes:", 4096, false},
		{"prefix is not a match", io, "cancelled_write_bytes:", 0, false},
		{"missing", status, "VmSwap:", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatusField(tc.b, tc.field)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseStatusField(%s) = %d, %v; want %d, error %t", tc.field, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestMedianAndMBps(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := mbps(100e6, 500); got != 200 {
		t.Errorf("mbps(100 MB, 500 ms) = %v, want 200", got)
	}
	if got := mbps(1, 0); got != 0 {
		t.Errorf("mbps(_, 0) = %v, want 0", got)
	}
}

func TestSnapshotOptionsNormalize(t *testing.T) {
	o := SnapshotOptions{SizesMB: []int{64, 1, 64}}
	if err := o.normalize(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.SizesMB, []int{1, 64}) || o.Reps != DefaultSnapshotReps || len(o.Kinds) != 2 || len(o.Stores) != 2 {
		t.Errorf("normalized %+v", o)
	}
	// The target's cell is added for random data in MinIO only.
	if got := cellSizes(o, StoreMinIO, DataRandom); !slices.Equal(got, []int{1, 64, TargetSizeMB}) {
		t.Errorf("cellSizes(minio, random) = %v", got)
	}
	if got := cellSizes(o, StoreLocal, DataRandom); !slices.Equal(got, []int{1, 64}) {
		t.Errorf("cellSizes(local, random) = %v", got)
	}
	for _, bad := range []SnapshotOptions{
		{SizesMB: []int{0}}, {SizesMB: []int{MaxSnapshotSizeMB + 1}}, {Kinds: []string{"ones"}}, {Stores: []string{"s3"}}, {Reps: -1},
	} {
		if err := bad.normalize(); err == nil {
			t.Errorf("normalize(%+v) accepted it", bad)
		}
	}
}

func TestSummarizeCells(t *testing.T) {
	run := func(path string, ckpt, restore float64, errMsg string) SnapshotRun {
		return SnapshotRun{Store: StoreLocal, Data: DataZero, SizeMB: 64, Path: path, CheckpointMS: ckpt, RestoreMS: restore,
			DumpMS: ckpt / 2, RawBytes: 64e6, StoredBytes: 1e6, UploadMS: 10, Error: errMsg}
	}
	cells := summarizeCells([]SnapshotRun{
		run(PathPipe, 100, 50, ""), run(PathBase, 400, 100, ""),
		run(PathPipe, 300, 70, ""), run(PathBase, 200, 300, ""),
		run(PathPipe, 0, 0, "criu dump failed"), run(PathBase, 300, 200, ""),
	})
	if len(cells) != 1 {
		t.Fatalf("%d cells, want 1", len(cells))
	}
	c := cells[0]
	if c.Pipelined.N != 2 || c.Pipelined.Failures != 1 || c.Baseline.N != 3 {
		t.Errorf("counts: %+v / %+v", c.Pipelined, c.Baseline)
	}
	if c.Pipelined.CheckpointMS != 200 || c.Baseline.CheckpointMS != 300 || c.RatioCheckpoint != 200.0/300 {
		t.Errorf("checkpoint medians %v / %v, ratio %v", c.Pipelined.CheckpointMS, c.Baseline.CheckpointMS, c.RatioCheckpoint)
	}
	if c.RatioRestore != 60.0/200 {
		t.Errorf("restore ratio %v, want 0.3", c.RatioRestore)
	}
	// 64 MB in a 100 ms dump is 640 MB/s; 1 MB uploaded in 10 ms, 100 MB/s.
	if c.Pipelined.Stages.Dump != 640 || c.Pipelined.Stages.Upload != 100 {
		t.Errorf("stages %+v", c.Pipelined.Stages)
	}
}

func TestSnapshotTablesAndPlots(t *testing.T) {
	rep := &SnapshotReport{Stores: []string{StoreLocal}, Kinds: []string{DataZero}, Reps: 1, Machine: Machine{NProc: 2}}
	for _, size := range []int{1, 16, 256} {
		for _, p := range []string{PathPipe, PathBase} {
			rep.Runs = append(rep.Runs, SnapshotRun{Store: StoreLocal, Data: DataZero, SizeMB: size, Path: p,
				CheckpointMS: float64(100 + size), RestoreMS: float64(80 + size), RawBytes: int64(size) << 20})
		}
	}
	rep.Runs = append(rep.Runs, SnapshotRun{Store: StoreLocal, Data: DataZero, SizeMB: 1, Rep: 2, Path: PathBase, Error: "criu dump failed (exit status 1):\n  Error (criu/cr-dump.c): boom"})
	rep.Cells = summarizeCells(rep.Runs)
	var out bytes.Buffer
	PrintSnapshotTables(&out, rep)
	for _, want := range []string{"ckpt pipe", "criu restore", "FAILED local zero 1 MB #2 baseline", "  Error (criu/cr-dump.c): boom"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, out.String())
		}
	}
	lines := snapshotPlotLines(rep, func(s PathSummary) float64 { return s.CheckpointMS })
	if len(lines) != 2 || len(lines[0].X) != 3 || lines[1].Dash != DashDashed {
		t.Fatalf("plot lines %+v", lines)
	}
	var png1 bytes.Buffer
	w := bufio.NewWriter(&png1)
	if err := renderXY(w, "t", "x", "y", lines); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	img, err := png.Decode(&png1)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != PlotWidth || b.Dy() != PlotHeight {
		t.Errorf("plot is %v", b)
	}
	if err := renderXY(&png1, "t", "x", "y", []xyLine{{Label: "empty"}}); err == nil {
		t.Error("renderXY drew a plot without points")
	}
}
