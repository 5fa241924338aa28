package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/procmem"
)

// ProcMem is the memory of one process (procmem.Mem).
type ProcMem = procmem.Mem

// nopLoopScript is a process-per-function design's idle NOP function: a
// process that has run the handler once and waits for the next event (one
// JSON line on stdin, one answer line on stdout).
var nopLoopScript = "import json, sys\n" + nopCode + `
def serve():
    sys.stdout.write(json.dumps(handler(None, None)) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        sys.stdout.write(json.dumps(handler(json.loads(line), None)) + "\n")
        sys.stdout.flush()
serve()
`

// measureNOPProcess starts a fresh `python -I -S` running nopLoopScript,
// makes one call through it, and returns its memory while it idles: what
// each function costs when every function is its own process.
func measureNOPProcess(ctx context.Context, python string) (ProcMem, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-I", "-S", "-c", nopLoopScript)
	setPdeathsig(cmd)
	stderr := &tailBuffer{max: 2 << 10}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return ProcMem{}, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return ProcMem{}, err
	}
	if err := cmd.Start(); err != nil {
		return ProcMem{}, fmt.Errorf("start %s: %w", python, err)
	}
	defer func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	r := bufio.NewReader(out)
	for i, send := range []string{"", "{}\n"} { // the first answer comes unasked
		if send != "" {
			if _, err := io.WriteString(in, send); err != nil {
				return ProcMem{}, fmt.Errorf("NOP process (%s): write an event: %w: %s", python, err, stderr)
			}
		}
		line, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "{}" {
			return ProcMem{}, fmt.Errorf("NOP process (%s): answer %d %q, %v: %s", python, i, line, err, stderr)
		}
	}
	m, err := procmem.Read(cmd.Process.Pid)
	if err != nil {
		return ProcMem{}, fmt.Errorf("NOP process: %w", err)
	}
	return m, nil
}
