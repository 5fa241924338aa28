package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// victim keeps a secret in its /tmp and a long-lived child process.
const victimSrc = `
import os, subprocess
SECRET = "victim-secret-code"
def handler(event, context):
    with open("/tmp/secret.txt", "w") as f:
        f.write("victim-secret-tmp")
    return {"ok": True}
`

// spy tries everything a hostile tenant would; each probe reports what it got.
const spySrc = `
import os, ctypes, signal, glob, socket
def own_loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.create_connection(srv.getsockname(), timeout=2)
    c.close()
    srv.close()
    return "ok"
def probe(f):
    try:
        return "OK:" + str(f())
    except Exception as e:
        return "DENIED:" + type(e).__name__
def write(path):
    with open(path, "w") as f:
        f.write("x")
    return path
def handler(event, context):
    home = event["home"]
    pids = event["pids"]
    libc = ctypes.CDLL(None, use_errno=True)
    def ptrace(pid):
        r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
        if r != 0:
            raise OSError(ctypes.get_errno(), "ptrace")
        return r
    out = {
        "list_home_code": probe(lambda: os.listdir(home + "/code")),
        "read_api_token": probe(lambda: open(home + "/api-token").read()),
        "glob_code": probe(lambda: glob.glob(home + "/code/*/app.py") or (_ for _ in ()).throw(FileNotFoundError())),
        "read_victim_tmp": probe(lambda: open("/tmp/secret.txt").read()),
        "write_root": probe(lambda: write("/evil")),
        "write_task": probe(lambda: write("/var/task/evil")),
        "write_usr": probe(lambda: write("/usr/evil")),
        "write_etc": probe(lambda: write("/etc/evil")),
        "write_tmp": probe(lambda: write("/tmp/mine")),
        "proc_list": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "connect_gateway": probe(lambda: socket.create_connection(("127.0.0.1", event["gateway_port"]), timeout=2)),
        "own_loopback": probe(own_loopback),
    }
    for pid in pids:
        out["kill_%d" % pid] = probe(lambda: os.kill(pid, signal.SIGKILL))
        out["ptrace_%d" % pid] = probe(lambda: ptrace(pid))
        out["root_%d" % pid] = probe(lambda: os.listdir("/proc/%d/root/var/task" % pid))
    return out
`

// TestIsolation: a function cannot read another function's code or /tmp,
// signal or ptrace its processes, or write outside its /tmp.
func TestIsolation(t *testing.T) {
	s := startServer(t)
	s.deploy("victim", victimSrc, deployOpts{})
	s.deploy("spy", spySrc, deployOpts{TimeoutS: 10})
	mustOK(t, s.invoke("victim", `{}`))

	var ver struct{ UID int }
	s.getJSON("/v1/functions/victim", &ver)
	pids := pidsOfUID(t, ver.UID)
	if len(pids) == 0 {
		t.Fatalf("no processes of victim uid %d found", ver.UID)
	}
	u, _ := url.Parse(s.endpoint)
	port, _ := strconv.Atoi(u.Port())
	ev, _ := json.Marshal(map[string]any{"home": s.home, "pids": pids, "gateway_port": port})
	body := mustOK(t, s.invoke("spy", string(ev)))
	var out map[string]any
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("spy saw: %s", body)
	for k, v := range out {
		str, _ := v.(string)
		switch {
		case k == "proc_list":
			// Its own pid namespace: it sees only its own few processes.
			if l, _ := v.([]any); len(l) > 5 {
				t.Errorf("spy sees %d processes: %v", len(l), l)
			}
		case k == "write_tmp" || k == "own_loopback":
			if !strings.HasPrefix(str, "OK") {
				t.Errorf("%s: %s (its own /tmp must be writable)", k, str)
			}
		default:
			if !strings.HasPrefix(str, "DENIED") {
				t.Errorf("%s: %s", k, str)
			}
		}
	}
	// The victim is unharmed.
	mustOK(t, s.invoke("victim", `{}`))
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			t.Errorf("victim process %d is gone", pid)
		}
	}
}

func pidsOfUID(t *testing.T, uid int) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == strconv.Itoa(uid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TestNoisyNeighbours: a fork bomb and a memory hog in one function leave the
// platform serving other functions.
func TestNoisyNeighbours(t *testing.T) {
	s := startServer(t)
	s.deploy("calm", "def handler(e, c):\n    return 'calm'\n", deployOpts{})
	s.deploy("bomb", `
import os, time
def handler(e, c):
    n = 0
    try:
        while True:
            if os.fork() == 0:
                try:
                    while True:
                        os.fork()
                except OSError:
                    time.sleep(5)
                os._exit(0)
            n += 1
    except OSError as ex:
        return {"forked": n, "error": str(ex)}
`, deployOpts{TimeoutS: 8})
	s.deploy("hog", "def handler(e, c):\n    x = []\n    while True:\n        x.append(bytearray(16 << 20))\n", deployOpts{MemoryMB: 128, TimeoutS: 20})

	var wg sync.WaitGroup
	results := make(chan string, 4)
	for _, fn := range []string{"bomb", "hog"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.invoke(fn, `{}`)
			results <- fmt.Sprintf("%s: %d %s", fn, r.Status, tail(r.Body, 300))
		}()
	}
	// While they misbehave, other calls keep being served, promptly.
	deadline := time.Now().Add(4 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		start := time.Now()
		if got := mustOK(t, s.invoke("calm", `{}`)); got != `"calm"` {
			t.Fatalf("calm: %s", got)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("a call took %s while a neighbour misbehaved", el)
		}
		n++
	}
	wg.Wait()
	close(results)
	for r := range results {
		t.Log(r)
		if !strings.HasPrefix(r[strings.Index(r, ":")+2:], "200") {
			t.Errorf("misbehaving call did not get an answer: %s", r)
		}
	}
	if n < 5 {
		t.Errorf("only %d calls served in 4s next to a fork bomb and a memory hog", n)
	}
	mustOK(t, s.invoke("calm", `{}`))
}
