package client

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// workers is a directory of one worker, w1, that holds function fn.
type workers struct {
	dropped string
	evicted api.EvictRequest
}

func (workers) List(context.Context) ([]api.WorkerSummary, error) {
	return []api.WorkerSummary{{ID: "w1", MemoryBudgetMB: 1024, Holdings: []api.Holding{{Function: "fn", Version: 1, Idle: 2}}}}, nil
}

func (workers) Info(_ context.Context, id string) (api.WorkerInfo, error) {
	if id != "w1" {
		return api.WorkerInfo{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running", id))
	}
	return api.WorkerInfo{WorkerSummary: api.WorkerSummary{ID: "w1"},
		Instances: []api.ProcessInfo{{Kind: "instance", Function: "fn", Version: 1, ID: "i-1", PSS: 1 << 20}}}, nil
}

func (w *workers) Drop(_ context.Context, name string, version int, keep bool) (api.DropResult, error) {
	if name != "fn" {
		return api.DropResult{}, errdefs.NotFound("function " + name + " not found")
	}
	w.dropped = fmt.Sprint(name, " ", version, " ", keep)
	return api.DropResult{Instances: 2, Workers: 1}, nil
}

func (w *workers) Evict(_ context.Context, id string, req api.EvictRequest) (api.EvictReport, error) {
	if id != "w1" {
		return api.EvictReport{}, errdefs.NotFound(fmt.Sprintf("no worker %q is running", id))
	}
	if req.GraceMS < 0 {
		return api.EvictReport{}, errdefs.Invalid("invalid grace_ms")
	}
	w.evicted = req
	return api.EvictReport{Worker: id, Reason: req.Reason, GraceMS: req.GraceMS, Running: 4}, nil
}

func TestWorkers(t *testing.T) {
	wk := &workers{}
	ts := httptest.NewServer(gateway.New(gatewaytest.NewBackend(), gateway.Options{Workers: wk}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	list, err := c.Workers(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "w1" || list[0].Holdings[0].Idle != 2 {
		t.Errorf("Workers = %+v, %v", list, err)
	}
	info, err := c.Worker(ctx, "w1")
	if err != nil || info.ID != "w1" || len(info.Instances) != 1 || info.Instances[0].PSS != 1<<20 {
		t.Errorf("Worker(w1) = %+v, %v", info, err)
	}
	if _, err := c.Worker(ctx, "w2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Worker(w2) = %v, want ErrNotFound", err)
	}
	if _, err := c.Worker(ctx, ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Worker(\"\") = %v, want ErrInvalid", err)
	}
	for _, tt := range []struct {
		version int
		keep    bool
		want    string
	}{{0, false, "fn 0 false"}, {3, true, "fn 3 true"}, {0, true, "fn 0 true"}} {
		res, err := c.DropInstances(ctx, "fn", tt.version, tt.keep)
		if err != nil || res.Instances != 2 || wk.dropped != tt.want {
			t.Errorf("DropInstances(fn, %d, %v) = %+v, %v; server saw %q", tt.version, tt.keep, res, err, wk.dropped)
		}
	}
	if _, err := c.DropInstances(ctx, "ghost", 0, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DropInstances(ghost) = %v, want ErrNotFound", err)
	}

	req := api.EvictRequest{GraceMS: 2500, Reason: "maintenance"}
	rep, err := c.Evict(ctx, "w1", req)
	if want := (api.EvictReport{Worker: "w1", Reason: "maintenance", GraceMS: 2500, Running: 4}); err != nil || rep != want || wk.evicted != req {
		t.Errorf("Evict(w1) = %+v, %v; server saw %+v", rep, err, wk.evicted)
	}
	for _, tt := range []struct {
		id   string
		req  api.EvictRequest
		want error
	}{
		{"w2", api.EvictRequest{}, errdefs.ErrNotFound},
		{"w1", api.EvictRequest{GraceMS: -1}, errdefs.ErrInvalid},
		{"", api.EvictRequest{}, errdefs.ErrInvalid},
		{"..", api.EvictRequest{}, errdefs.ErrInvalid},
	} {
		if _, err := c.Evict(ctx, tt.id, tt.req); !errors.Is(err, tt.want) {
			t.Errorf("Evict(%q, %+v) = %v, want %v", tt.id, tt.req, err, tt.want)
		}
	}
}
