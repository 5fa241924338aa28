package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestForkBaseline(t *testing.T) {
	py := requirePython(t)
	ctx := context.Background()
	pidScript := forkHandlerScript("import os\ndef handler(e, c):\n    return {'pid': os.getpid(), 'event': e}\n")
	b, err := StartForkBaseline(ctx, py, map[string]string{"/nop": forkNOPScript, "/pid": pidScript, "/fail": "import sys\nsys.exit('boom')\n"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	hc := newHTTPClient(4)

	// The NOP answers {} as the benchmarks' call check wants.
	res, _, err := runCalls(ctx, hc, target{series: SeriesFork, url: b.URL + "/nop"}, 8, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
	}

	// A fresh process per request, fed the event on stdin.
	pids := map[float64]bool{}
	for i := 0; i < 5; i++ {
		resp, err := hc.Post(b.URL+"/pid", "application/json", strings.NewReader(`{"n": 7}`))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			PID   float64        `json:"pid"`
			Event map[string]int `json:"event"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || got.PID == 0 || got.Event["n"] != 7 {
			t.Fatalf("answer %+v, %v", got, err)
		}
		pids[got.PID] = true
	}
	if len(pids) != 5 {
		t.Errorf("5 requests ran in %d processes, want one each", len(pids))
	}
	if n := b.Spawned(); n != 8+5 {
		t.Errorf("Spawned() = %d, want 13", n)
	}

	// A failing process is a 502 carrying its stderr; an unknown path 404.
	for path, want := range map[string]int{"/fail": http.StatusBadGateway, "/nope": http.StatusNotFound} {
		resp, err := hc.Post(b.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (path == "/fail" && !strings.Contains(string(body), "boom")) {
			t.Errorf("%s: HTTP %d %q, want %d", path, resp.StatusCode, body, want)
		}
	}

	b.Close()
	b.Close() // idempotent
	if _, err := http.Post(b.URL+"/nop", "application/json", strings.NewReader("{}")); err == nil {
		t.Errorf("the baseline still answers after Close")
	}
}

func TestForkBaselineBadInterpreter(t *testing.T) {
	if _, err := StartForkBaseline(context.Background(), "/nonexistent/python3", nil); err == nil || !strings.Contains(err.Error(), "/nonexistent/python3") {
		t.Fatalf("err = %v, want one naming the interpreter", err)
	}
}

func TestMeasureNOPProcess(t *testing.T) {
	py := requirePython(t)
	m, err := measureNOPProcess(context.Background(), py)
	if err != nil {
		t.Fatal(err)
	}
	if m.USS < 256<<10 || m.USS > m.PSS || m.PSS > m.RSS || m.RSS > 256<<20 {
		t.Errorf("memory %+v: want 256 KiB < USS <= PSS <= RSS < 256 MiB", m)
	}
	if _, err := measureNOPProcess(context.Background(), "/bin/false"); err == nil {
		t.Error("a process that exits at once was measured")
	}
}
