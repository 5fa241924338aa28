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
type workers struct{ dropped string }

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
}
