package gatewaytest

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/gateway"
)

var (
	// The suite's method set is gateway.Backend's, exactly.
	_ gateway.Backend = backendAPI(nil)
	_ backendAPI      = gateway.Backend(nil)

	_ gateway.Backend = (*Backend)(nil)
)

func TestBackendConformance(t *testing.T) {
	RunBackendConformance(t, func(t *testing.T) gateway.Backend { return NewBackend() })
}
