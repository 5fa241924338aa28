package testenv

import (
	"net/http"
	"testing"

	"github.com/torpor-dev/torpor/internal/miniosrv"
)

func TestMinIO(t *testing.T) {
	var srv *miniosrv.Server
	t.Run("inner", func(t *testing.T) {
		srv = MinIO(t)
		if srv.Endpoint == "" || srv.AccessKey == "" || len(srv.SecretKey) < 8 {
			t.Fatalf("MinIO() = %+v, want an endpoint and credentials", srv)
		}
		resp, err := http.Get(srv.Endpoint + "/minio/health/ready")
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("health/ready = %d, want 200", resp.StatusCode)
		}
	})
	if srv == nil {
		t.Skip("no MinIO")
	}
	if _, err := http.Get(srv.Endpoint + "/minio/health/live"); err == nil {
		t.Errorf("MinIO at %s still answers after its test ended", srv.Endpoint)
	}
}
