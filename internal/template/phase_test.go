package template_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func TestPhases(t *testing.T) {
	rt, fs := stack(t, "def handler(e, c):\n    return {}\n")
	ctx := testenv.Ctx(t)
	for i := range 8 {
		time.Sleep(100 * time.Millisecond) // spares refilled
		fs.ID = fmt.Sprintf("t-ph-%d", i)
		t0 := time.Now()
		fn, err := rt.ForkFunction(ctx, fs)
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if _, err := fn.Client().Init(ctx, agentproto.InitParams{Function: "fn", Version: 1, Handler: "app.handler", MemoryMB: 128, Timeout: 10 * time.Second, CodeDir: "/var/task"}, nil); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		sb, cl, err := fn.Fork(ctx, fmt.Sprintf("i-ph-%d", i), sandbox.Limits{MemoryMB: 128, Pids: 32})
		if err != nil {
			t.Fatal(err)
		}
		t3 := time.Now()
		invoke(t, cl, "{}")
		t4 := time.Now()
		t.Logf("forkFunction %v init %v fork %v invoke %v total %v", t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t4.Sub(t0))
		cl.Close()
		_ = sb.Destroy(ctx)
		_ = fn.Close(ctx)
	}
}
