package bench

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Machine describes where a benchmark ran, so that numbers from different
// machines are never compared unknowingly.
type Machine struct {
	NProc      int       `json:"nproc"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	CPUModel   string    `json:"cpu_model"`
	Kernel     string    `json:"kernel"`
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	GoVersion  string    `json:"go_version"` // of the benchmark binary
	Python     string    `json:"python"`     // baseline interpreter and its version
	Hostname   string    `json:"hostname"`
	LoadAvg    string    `json:"loadavg"` // /proc/loadavg when the run started
	Timestamp  time.Time `json:"timestamp"`
}

// probeMachine describes this machine; python is the baseline's resolved
// interpreter. Facts it cannot read are left empty.
func probeMachine(ctx context.Context, python string, now time.Time) Machine {
	m := Machine{
		NProc:      runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		OS:         runtime.GOOS,
		Arch:       runtime.GOARCH,
		GoVersion:  runtime.Version(),
		Timestamp:  now.UTC(),
	}
	m.CPUModel = cpuModel("/proc/cpuinfo")
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
	m.LoadAvg = readTrim("/proc/loadavg")
	m.Hostname, _ = os.Hostname()
	if python != "" {
		m.Python = python
		if out, err := exec.CommandContext(ctx, python, "-V").CombinedOutput(); err == nil {
			m.Python += " (" + strings.TrimSpace(string(out)) + ")"
		}
	}
	return m
}

// cpuModel returns the first "model name" of a /proc/cpuinfo file.
func cpuModel(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
