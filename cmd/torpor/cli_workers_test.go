package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// cliWorkers is a directory of two workers; w1 holds fn.
type cliWorkers struct {
	dropped string
	evicted api.EvictRequest
}

func (cliWorkers) List(context.Context) ([]api.WorkerSummary, error) {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	return []api.WorkerSummary{
		{ID: "w1", UpdatedAt: now, MemoryBudgetMB: 3072, ReservedMB: 256, Running: 1, Holdings: []api.Holding{
			{Function: "fn", Version: 1, Idle: 1}, {Function: "fn", Version: 2, Idle: 2, Template: true}, {Function: "other", Version: 1, Template: true}}},
		{ID: "w2", UpdatedAt: now, MemoryBudgetMB: 1024},
	}, nil
}

func (cliWorkers) Info(_ context.Context, id string) (api.WorkerInfo, error) {
	if id != "w1" {
		return api.WorkerInfo{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running: `torpor workers` lists the live ones", id))
	}
	return api.WorkerInfo{WorkerSummary: api.WorkerSummary{ID: "w1", MemoryBudgetMB: 3072, ReservedMB: 256},
		MemAvailableMB: 5000, LowWatermarkMB: 500, HighWatermarkMB: 800,
		Templates: []api.ProcessInfo{{Kind: "function-template", Function: "fn", Version: 2, ID: "t-1", Pid: 100, RSS: 30 << 20, PSS: 20 << 20, USS: 10 << 20}},
		Instances: []api.ProcessInfo{{Kind: "instance", Function: "fn", Version: 2, ID: "i-1", Pid: 101, State: "idle", Start: "warm",
			RSS: 30 << 20, PSS: 12 << 20, USS: 3 << 19}},
	}, nil
}

func (w *cliWorkers) Drop(_ context.Context, name string, version int, keep bool) (api.DropResult, error) {
	w.dropped = fmt.Sprint(name, " ", version, " ", keep)
	return api.DropResult{Instances: 3, Templates: 1, Workers: 2}, nil
}

func (w *cliWorkers) Evict(_ context.Context, id string, req api.EvictRequest) (api.EvictReport, error) {
	if id != "w1" {
		return api.EvictReport{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running: `torpor workers` lists the live ones", id))
	}
	w.evicted = req
	grace := req.GraceMS
	if grace == 0 {
		grace = 30000
	}
	return api.EvictReport{Worker: id, Reason: req.Reason, GraceMS: grace, Running: 3}, nil
}

func TestWorkersCommands(t *testing.T) {
	wk := &cliWorkers{}
	ts := httptest.NewServer(gateway.New(gatewaytest.NewBackend(), gateway.Options{Workers: wk}))
	t.Cleanup(ts.Close)
	e := &cliEnv{url: ts.URL}

	r := e.run(t, "", "workers")
	r.want(t, 0, "RESERVED/BUDGET", "")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "w1") || !strings.Contains(lines[1], "256/3072 MB") {
		t.Errorf("workers:\n%s", r.stdout)
	}
	// w1: 1 running, 2 functions, 3 idle instances, 2 templates.
	if f := strings.Fields(lines[1]); len(f) < 7 || strings.Join(f[3:7], " ") != "1 2 3 2" {
		t.Errorf("w1 row %q: want running 1, functions 2, idle 3, templates 2", lines[1])
	}

	r = e.run(t, "", "workers", "inspect", "w1")
	r.want(t, 0, "host memory available 5000 MB", "")
	for _, want := range []string{"function-template  fn", "instance           fn", "idle", "warm", "20.0", "12.0", "1.5", "total"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect lacks %q:\n%s", want, r.stdout)
		}
	}
	e.run(t, "", "workers", "inspect", "w1", "--json").want(t, 0, `"pss": 20971520`, "")
	e.run(t, "", "workers", "inspect", "nope").want(t, 1, "", `no worker "nope" is running`)
	e.run(t, "", "workers", "inspect").want(t, 2, "", "needs ID")

	e.run(t, "", "workers", "drop", "fn", "--version", "2", "--keep-templates").
		want(t, 0, "stopped 3 idle instance(s) and 1 template(s) of fn on 2 worker(s)", "")
	if wk.dropped != "fn 2 true" {
		t.Errorf("server saw drop %q, want fn 2 true", wk.dropped)
	}

	for _, tt := range []struct {
		name  string
		args  []string
		asked api.EvictRequest
		out   string
	}{
		{"defaults", nil, api.EvictRequest{}, "evicting worker w1: 3 calls running, grace 30s\n"},
		{"grace and reason", []string{"--grace", "2m", "--reason", "kernel upgrade"}, api.EvictRequest{GraceMS: 120000, Reason: "kernel upgrade"},
			"evicting worker w1: 3 calls running, grace 2m0s\n"},
		{"grace under a millisecond", []string{"--grace", "10us"}, api.EvictRequest{GraceMS: 1}, "grace 1ms"},
	} {
		r := e.run(t, "", append([]string{"workers", "evict", "w1"}, tt.args...)...)
		r.want(t, 0, tt.out, "")
		if wk.evicted != tt.asked {
			t.Errorf("%s: server saw evict %+v, want %+v", tt.name, wk.evicted, tt.asked)
		}
	}
	e.run(t, "", "workers", "evict", "nope").want(t, 1, "", `no worker "nope" is running`)
	e.run(t, "", "workers", "evict").want(t, 2, "", "needs ID")
	e.run(t, "", "workers", "evict", "w1", "--grace", "-1s").want(t, 2, "", "invalid --grace -1s")
	e.run(t, "", "workers", "evict", "w1", "--grace", "soon").want(t, 2, "", "invalid argument")
}
