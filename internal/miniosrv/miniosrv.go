// Package miniosrv starts a real MinIO server on loopback, for the S3
// blob-store tests (through testenv.MinIO) and the snapshot benchmark. The
// platform itself never runs it: in production the S3 store is whatever
// the operator points --snapshot-store at. scripts/install-minio.sh builds
// the binary.
package miniosrv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultPath is where scripts/install-minio.sh puts the binary.
const DefaultPath = "/var/cache/torpor/bin/minio"

// startTimeout bounds one start; it takes ~0.4 s on a quiet 2-core box.
const startTimeout = 30 * time.Second

// Binary finds MinIO: $TORPOR_MINIO, else DefaultPath, else minio on PATH.
// When there is none it returns "" and why.
func Binary() (path, why string) {
	if p := os.Getenv("TORPOR_MINIO"); p != "" {
		return p, ""
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath, ""
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p, ""
	}
	return "", "needs MinIO: not at $TORPOR_MINIO, " + DefaultPath + " or on PATH (run scripts/install-minio.sh as root)"
}

// Server is a running MinIO with its own data directory and root
// credentials.
type Server struct {
	Endpoint  string // http://127.0.0.1:PORT
	AccessKey string // the root user's credentials
	SecretKey string
	DataDir   string

	stop func()
}

// Stop kills the server and waits for it.
func (s *Server) Stop() { s.stop() }

var errPortTaken = errors.New("port taken")

// Start runs bin on free loopback ports with its data, certificates and
// log under dir (which should be empty), and returns once it answers its
// liveness probe. The kernel kills it if this process dies first.
func Start(ctx context.Context, bin, dir string) (*Server, error) {
	var last error
	// A port found free may be taken before MinIO binds it; it then exits
	// at once and another pair is tried.
	for attempt := 0; attempt < 3; attempt++ {
		srv, err := startOnce(ctx, bin, filepath.Join(dir, fmt.Sprint(attempt)))
		if err == nil {
			return srv, nil
		}
		last = err
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, fmt.Errorf("start MinIO (%s): %w", bin, last)
}

func startOnce(ctx context.Context, bin, dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	srv := &Server{AccessKey: "torpor-" + randomHex(8), SecretKey: randomHex(20), DataDir: filepath.Join(dir, "data")}
	addr, err := FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	console, err := FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	srv.Endpoint = "http://" + addr
	logPath := filepath.Join(dir, "minio.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "server", "--quiet", "--address", addr, "--console-address", console,
		"--certs-dir", filepath.Join(dir, "certs"), srv.DataDir)
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+srv.AccessKey,
		"MINIO_ROOT_PASSWORD="+srv.SecretKey,
		"MINIO_UPDATE=off", // no update check over the network
		"MINIO_CI_CD=on",   // accept a data dir on the root disk
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	srv.stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			if strings.Contains(string(out), "already in use") {
				return nil, fmt.Errorf("%w: %s", errPortTaken, out)
			}
			return nil, fmt.Errorf("MinIO exited; its log:\n%s", out)
		case <-ctx.Done():
			srv.stop()
			return nil, ctx.Err()
		default:
		}
		if resp, err := client.Get(srv.Endpoint + "/minio/health/live"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return srv, nil
			}
		}
		if time.Now().After(deadline) {
			srv.stop()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("MinIO did not answer %s/minio/health/live within %s; its log:\n%s", srv.Endpoint, startTimeout, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreeLoopbackAddr returns a loopback address whose port was free a moment
// ago.
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
