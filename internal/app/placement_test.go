package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/dispatch"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// gateway is a node of the cluster without a worker, as `torpor gateway`
// runs: every call it makes goes over NATS.
func (c cluster) gateway(t *testing.T) node {
	t.Helper()
	log := testenv.Logger(t).With("node", "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg, err := registry.New(ctx, c.bus.Functions, c.bus.Code, log)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := dispatch.NewDirectory(ctx, c.bus, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	return node{d: dispatch.New(c.bus, reg, callstore.New(c.bus.Calls), nil, dir, log), dir: dir}
}

// TestPlacementFollowsTheInstance runs a gateway and two workers on one
// bus. Once one worker holds an instance of a function, the gateway's
// synchronous calls all land on that worker, hot, on that one instance:
// the call records name the worker, and the function's call counter never
// restarts. Through the queue group alone each call would have an even
// chance to go to the other worker.
func TestPlacementFollowsTheInstance(t *testing.T) {
	c := newCluster(t, nil)
	nodes := map[string]node{"w-a": c.node(t, "w-a"), "w-b": c.node(t, "w-b")}
	gw := c.gateway(t)
	ctx := testenv.Ctx(t)
	// The deploy's validation leaves an idle instance on whichever worker ran it.
	gw.deploy(t, "sticky", statefulCode, 128)

	var holder string
	testenv.Eventually(t, 10*time.Second, "the worker directory to show the validated instance", func() bool {
		list, _ := gw.dir.List(ctx)
		for _, w := range list {
			for _, h := range w.Holdings {
				if h.Function == "sticky" && h.Idle > 0 {
					holder = w.ID
					return true
				}
			}
		}
		return false
	})
	var ids []string
	for i := 1; i <= 8; i++ {
		s, res := invokeStateful(t, gw, "sticky", `{}`)
		if s.N != i || res.Start != function.StartHot {
			t.Errorf("call %d: counter %d, start %q; want %d, hot (one instance, on %s)", i, s.N, res.Start, i, holder)
		}
		ids = append(ids, res.CallID)
	}
	calls := callstore.New(c.bus.Calls)
	for _, id := range ids {
		var rec function.Call
		testenv.Eventually(t, 5*time.Second, "the record of call "+id, func() bool {
			var err error
			rec, err = calls.Get(ctx, id)
			return err == nil
		})
		if len(rec.Attempts) != 1 || rec.Attempts[0].Worker != holder {
			t.Errorf("call %s ran on %+v, want %s", id, rec.Attempts, holder)
		}
	}

	// The operator routes reach every worker.
	list, err := gw.dir.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %+v, %v; want both workers", list, err)
	}
	for id := range nodes {
		info, err := gw.dir.Info(ctx, id)
		if err != nil || info.ID != id {
			t.Errorf("Info(%s) = %+v, %v", id, info, err)
		}
	}
	start := time.Now()
	res, err := gw.dir.Drop(ctx, "sticky", 0, false)
	if err != nil || res.Workers != 2 {
		t.Errorf("Drop = %+v, %v; want the answers of both workers", res, err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("Drop took %s although both workers answered", time.Since(start))
	}
}
