package dispatch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/callmsg"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func TestDeployWithoutWorker(t *testing.T) {
	e := newEnv(t)
	_, err := e.d.Deploy(testenv.Ctx(t), function.Spec{Name: "f", Handler: "app.handler"}, codeZip(t))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no worker is running") {
		t.Errorf("Deploy = %v, want ErrUnavailable saying no worker is running", err)
	}
	if fns := e.reg.Functions(); len(fns) != 0 {
		t.Errorf("a deploy nobody validated was stored: %+v", fns)
	}
}

func TestDeploy(t *testing.T) {
	e := newEnv(t)
	asked := e.fakeValidator(t, okValidation)
	e.fakeWorker(t, func(req function.InvokeRequest) *nats.Msg {
		return callmsg.Reply(function.InvokeResult{CallID: req.CallID, Version: req.Version, Payload: []byte(`"hi"`)})
	})
	ctx := testenv.Ctx(t)
	code := codeZip(t)
	sum := sha256.Sum256(code)

	v, err := e.d.Deploy(ctx, function.Spec{Name: "greet", Handler: "app.handler", Env: map[string]string{"A": "1"}}, code)
	if err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	if v.Version != 1 || v.Runtime != "python3" || v.MemoryMB != function.DefaultMemoryMB || v.CodeSize != int64(len(code)) ||
		v.CodeDigest != hex.EncodeToString(sum[:]) || v.UID <= registry.UIDBase {
		t.Errorf("Deploy = %+v", v)
	}
	select {
	case got := <-asked:
		if got.Name != "greet" || got.Version != 1 || got.CodeDigest != v.CodeDigest || got.UID != v.UID || got.Env["A"] != "1" {
			t.Errorf("validator was asked about %+v", got)
		}
	default:
		t.Error("Deploy did not ask a worker to validate")
	}
	// Visible at once through this dispatcher, without polling.
	if got, err := e.d.Function(ctx, "greet", 0); err != nil || got.Version != 1 {
		t.Errorf("Function right after Deploy = %+v, %v", got, err)
	}
	if res, err := e.d.Invoke(ctx, function.InvokeRequest{Function: "greet"}); err != nil || string(res.Payload) != `"hi"` {
		t.Errorf("Invoke right after Deploy = %+v, %v", res, err)
	}
	if stored, err := e.reg.Code(ctx, v.CodeDigest); err != nil || !bytes.Equal(stored, code) {
		t.Errorf("code package not stored: %v", err)
	}

	v2, err := e.d.Deploy(ctx, function.Spec{Name: "greet", Handler: "app.handler"}, code)
	if err != nil || v2.Version != 2 || v2.UID != v.UID {
		t.Errorf("redeploy = %+v, %v", v2, err)
	}
	if got, err := e.d.Function(ctx, "greet", 0); err != nil || got.Version != 2 {
		t.Errorf("Function right after redeploy = %+v, %v", got, err)
	}
	fns, _ := e.d.Functions(ctx)
	if len(fns) != 1 || fns[0].Version != 2 {
		t.Errorf("Functions = %+v", fns)
	}

	if err := e.d.DeleteFunction(ctx, "greet"); err != nil {
		t.Fatalf("DeleteFunction: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, "deleted function to go", func() bool {
		_, err := e.d.Function(ctx, "greet", 0)
		return errors.Is(err, errdefs.ErrNotFound)
	})
	if err := e.d.DeleteFunction(ctx, "bad/name"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("DeleteFunction(bad/name) = %v, want ErrInvalid", err)
	}
}

func TestDeployValidationFailure(t *testing.T) {
	e := newEnv(t)
	trace := []string{
		"  File \"/var/task/app.py\", line 1, in <module>\n    import missing_dep\n",
		"  File \"<frozen importlib._bootstrap>\", line 1204, in _gcd_import\n",
	}
	fail := true
	var mu sync.Mutex
	e.fakeValidator(t, func(v function.Version) *nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		if !fail {
			return okValidation(v)
		}
		return callmsg.Reply(function.InvokeResult{Version: v.Version, Err: &function.Error{
			ErrorType: "Runtime.ImportModuleError", ErrorMessage: "Unable to import module 'app': No module named 'missing_dep'",
			StackTrace: trace}})
	})
	ctx := testenv.Ctx(t)

	_, err := e.d.Deploy(ctx, function.Spec{Name: "broken", Handler: "app.handler"}, codeZip(t))
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Deploy = %v, want ErrInvalid", err)
	}
	for _, w := range []string{"broken", "Runtime.ImportModuleError", "No module named 'missing_dep'", trace[0], trace[1]} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	// Nothing stored: no function, no version, and the counter did not move.
	if _, err := e.d.Function(ctx, "broken", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Function(broken) = %v, want ErrNotFound", err)
	}
	if fns := e.reg.Functions(); len(fns) != 0 {
		t.Errorf("Functions = %+v", fns)
	}
	if _, err := e.bus.Functions.Get(ctx, "fn.broken"); err == nil {
		t.Error("a rejected deploy wrote fn.broken")
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	v, err := e.d.Deploy(ctx, function.Spec{Name: "broken", Handler: "app.handler"}, codeZip(t))
	if err != nil || v.Version != 1 {
		t.Errorf("deploy after a rejected one = %+v, %v; want version 1", v, err)
	}
}

func TestDeployPlatformErrorFromValidator(t *testing.T) {
	e := newEnv(t)
	e.fakeValidator(t, func(function.Version) *nats.Msg {
		return callmsg.ErrorReply(errors.Join(errors.New("sandbox: cgroup setup failed"), errdefs.ErrUnavailable))
	})
	_, err := e.d.Deploy(testenv.Ctx(t), function.Spec{Name: "f", Handler: "app.handler"}, codeZip(t))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "cgroup setup failed") {
		t.Errorf("Deploy = %v, want the worker's ErrUnavailable", err)
	}
}

func TestDeployRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	asked := e.fakeValidator(t, okValidation)
	tests := []struct {
		name  string
		spec  function.Spec
		code  []byte
		class error
		text  string
	}{
		{"bad spec", function.Spec{Name: "f", Handler: "nodot"}, codeZip(t), errdefs.ErrInvalid, "handler"},
		{"bad name", function.Spec{Name: "", Handler: "app.handler"}, codeZip(t), errdefs.ErrInvalid, "function name"},
		{"not a zip", function.Spec{Name: "f", Handler: "app.handler"}, []byte("hello"), nil, "code package of f"},
		{"too large", function.Spec{Name: "f", Handler: "app.handler"}, make([]byte, function.MaxCodeZipBytes+1),
			errdefs.ErrTooLarge, "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.d.Deploy(testenv.Ctx(t), tt.spec, tt.code)
			if err == nil {
				t.Fatal("Deploy succeeded")
			}
			if tt.class != nil && !errors.Is(err, tt.class) {
				t.Errorf("Deploy = %v, want %v", err, tt.class)
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("error %q does not contain %q", err, tt.text)
			}
		})
	}
	if len(asked) != 0 {
		t.Errorf("invalid deploys reached the validator %d times", len(asked))
	}
}

// A deploy the worker rejects stores no version and leaves no code package.
func TestDeployRejectedLeavesNoCode(t *testing.T) {
	e := newEnv(t)
	e.fakeValidator(t, func(v function.Version) *nats.Msg {
		return callmsg.Reply(function.InvokeResult{Version: v.Version, Err: &function.Error{ErrorType: "SyntaxError", ErrorMessage: "x"}})
	})
	ctx := testenv.Ctx(t)
	code := codeZip(t)
	if _, err := e.d.Deploy(ctx, function.Spec{Name: "rejected", Handler: "app.handler"}, code); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Deploy = %v", err)
	}
	sum := sha256.Sum256(code)
	if _, err := e.bus.Code.GetInfo(ctx, hex.EncodeToString(sum[:])); err == nil {
		t.Errorf("a rejected deploy left its code package in %s", bus.BucketCode)
	}
	// The uid stays reserved for the name, by design: a uid never moves to another function.
	if _, err := e.bus.Functions.Get(ctx, "uid.rejected"); err != nil {
		t.Errorf("uid of the rejected function: %v", err)
	}
}
