package gateway

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
)

// openAPIOperations reads "METHOD /path" for every operation of
// api/openapi.yaml. There is no YAML parser in go.mod, so this relies on the
// file's layout: paths at two spaces of indent, methods at four.
func openAPIOperations(t *testing.T) (ops []string, schemas []string) {
	t.Helper()
	pathRE := regexp.MustCompile(`^  (/[^:]*):\s*$`)
	methodRE := regexp.MustCompile(`^    (get|put|post|delete|patch|head|options):\s*$`)
	schemaRE := regexp.MustCompile(`^    ([A-Za-z]+):\s*$`)
	section, path := "", ""
	for i, line := range strings.Split(string(api.OpenAPI), "\n") {
		if strings.Contains(line, "\t") {
			t.Fatalf("openapi.yaml line %d has a tab: YAML forbids tabs in indentation", i+1)
		}
		switch {
		case line == "paths:":
			section = "paths"
			continue
		case line == "  schemas:" && section == "components":
			section = "schemas"
			continue
		case line == "components:":
			section = "components"
			continue
		case len(line) > 0 && line[0] != ' ' && line[0] != '#':
			section = ""
		}
		switch section {
		case "paths":
			if m := pathRE.FindStringSubmatch(line); m != nil {
				path = m[1]
			} else if m := methodRE.FindStringSubmatch(line); m != nil && path != "" {
				ops = append(ops, strings.ToUpper(m[1])+" "+path)
			}
		case "schemas":
			if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "    ") && strings.TrimSpace(line) != "" {
				section = "components"
			} else if m := schemaRE.FindStringSubmatch(line); m != nil {
				schemas = append(schemas, m[1])
			}
		}
	}
	return ops, schemas
}

func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	if !strings.HasPrefix(string(api.OpenAPI), "openapi: 3.1") {
		t.Fatalf("api/openapi.yaml does not start with openapi: 3.1")
	}
	ops, schemas := openAPIOperations(t)
	s := New(gatewaytest.NewBackend(), Options{})
	var routes []string
	for _, rt := range s.routes {
		routes = append(routes, rt.pattern)
		if !slices.Contains(ops, rt.pattern) {
			t.Errorf("route %q is not documented in api/openapi.yaml", rt.pattern)
		}
	}
	for _, op := range ops {
		if !slices.Contains(routes, op) {
			t.Errorf("api/openapi.yaml documents %q, which the gateway does not serve", op)
		}
	}
	for _, want := range []string{"Version", "Call", "Error", "LogLine", "FunctionError", "LambdaError", "DeployRequest"} {
		if !slices.Contains(schemas, want) {
			t.Errorf("api/openapi.yaml has no schema %s (has %v)", want, schemas)
		}
	}
	for _, hdr := range []string{"X-Amz-Invocation-Type", "X-Amz-Log-Type", "X-Amz-Log-Result", "X-Amz-Function-Error",
		"X-Amz-Executed-Version", "X-Amzn-RequestId", "X-Amzn-ErrorType", "X-Torpor-Call-Id", "X-Torpor-Version",
		"X-Torpor-Start", "X-Torpor-Function-Error", "Server-Timing"} {
		if doc := string(api.OpenAPI); !strings.Contains(doc, hdr+":") && !strings.Contains(doc, "name: "+hdr+"\n") {
			t.Errorf("api/openapi.yaml does not document header %s", hdr)
		}
	}
}

// TestOpenAPIValid validates api/openapi.yaml against the OpenAPI 3.1
// schema with openapi-spec-validator, since Go has no such validator in
// go.mod. scripts/test.sh installs it in a venv and names that venv's
// interpreter in TORPOR_TEST_PYTHON; a plain `go test` skips without it,
// CI (CI=true) fails.
func TestOpenAPIValid(t *testing.T) {
	missing := t.Skipf
	if os.Getenv("CI") != "" {
		missing = t.Fatalf
	}
	py := os.Getenv("TORPOR_TEST_PYTHON")
	if py == "" {
		var err error
		if py, err = exec.LookPath("python3"); err != nil {
			missing("python3 not found: cannot run openapi-spec-validator (scripts/test.sh installs it)")
			return
		}
	}
	if err := exec.Command(py, "-c", "import openapi_spec_validator, yaml").Run(); err != nil {
		missing("%s lacks openapi-spec-validator or PyYAML: run scripts/test.sh, which installs them", py)
		return
	}
	doc, err := filepath.Abs(filepath.Join("..", "..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "-c", `import sys, yaml
from openapi_spec_validator import validate
validate(yaml.safe_load(open(sys.argv[1])))`, doc).CombinedOutput()
	if err != nil {
		t.Fatalf("api/openapi.yaml is not a valid OpenAPI document: %v\n%s", err, out)
	}
}
