// Package procmem reads how much memory a process uses, as the kernel
// accounts it in /proc/PID/smaps_rollup.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mem is the memory of one process, in bytes: resident, proportional (each
// shared page divided among the processes mapping it) and unique (private:
// freed if the process exits).
type Mem struct {
	RSS int64 `json:"rss"`
	PSS int64 `json:"pss"`
	USS int64 `json:"uss"`
}

// Read reads pid's smaps_rollup.
func Read(pid int) (Mem, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return Mem{}, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	return Parse(b)
}

// Parse parses a smaps_rollup file; USS is its Private_Clean plus
// Private_Dirty. A missing line is an error that names it.
func Parse(b []byte) (Mem, error) {
	fields := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Mem{}, fmt.Errorf("smaps_rollup: %s %q: %w", k, v, err)
		}
		fields[k] = n << 10
	}
	for _, k := range []string{"Rss", "Pss", "Private_Clean", "Private_Dirty"} {
		if _, ok := fields[k]; !ok {
			return Mem{}, fmt.Errorf("smaps_rollup: no %s line", k)
		}
	}
	return Mem{RSS: fields["Rss"], PSS: fields["Pss"], USS: fields["Private_Clean"] + fields["Private_Dirty"]}, nil
}
