package blobopen

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		dir     string
		s3      *s3store.Config
		errWith string // a part of the error, for bad specs
	}{
		{spec: "/var/lib/torpor/blobs", dir: "/var/lib/torpor/blobs"},
		{spec: "/var/lib/torpor/blobs/../b/", dir: "/var/lib/torpor/b"},
		{spec: "file:///var/lib/torpor/blobs", dir: "/var/lib/torpor/blobs"},
		{spec: "file:/var/lib/torpor/blobs", dir: "/var/lib/torpor/blobs"},
		{spec: "s3://snapshots", s3: &s3store.Config{Bucket: "snapshots"}},
		{spec: "s3://snapshots/", s3: &s3store.Config{Bucket: "snapshots"}},
		{spec: "s3://snapshots/torpor/prod/", s3: &s3store.Config{Bucket: "snapshots", Prefix: "torpor/prod"}},
		{
			spec: "s3://snap/p?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true&part_size=16MiB&concurrency=8",
			s3: &s3store.Config{Bucket: "snap", Prefix: "p", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1",
				PathStyle: true, PartSize: 16 << 20, Concurrency: 8},
		},
		{spec: "s3://snap?part_size=5242880&path_style=0", s3: &s3store.Config{Bucket: "snap", PartSize: 5 << 20}},
		{spec: "s3://snap?part_size=1GiB", s3: &s3store.Config{Bucket: "snap", PartSize: 1 << 30}},

		{spec: "", errWith: "empty"},
		{spec: "blobs", errWith: "absolute"},
		{spec: "./blobs", errWith: "absolute"},
		{spec: "gs://bucket", errWith: `unknown scheme "gs"`},
		{spec: "file://host/path", errWith: `host "host"`},
		{spec: "file://blobs", errWith: `host "blobs"`},
		{spec: "file:relative", errWith: "absolute"},
		{spec: "file:///a?x=1", errWith: "no ?query"},
		{spec: "s3://", errWith: "no bucket"},
		{spec: "s3:bucket", errWith: "no bucket"},
		{spec: "s3:///prefix", errWith: "no bucket"},
		{spec: "s3://key:secret@bucket", errWith: "credentials do not go in the spec"},
		{spec: "s3://Bad_Bucket", errWith: `s3 bucket "Bad_Bucket"`},
		{spec: "s3://b-b/a b", errWith: "s3 prefix"},
		{spec: "s3://b-b?pathstyle=true", errWith: `unknown parameter "pathstyle"`},
		{spec: "s3://b-b?path_style=yes", errWith: "path_style"},
		{spec: "s3://b-b?part_size=8MB", errWith: "part_size"},
		{spec: "s3://b-b?part_size=1MiB", errWith: "part size"},
		{spec: "s3://b-b?part_size=-1", errWith: "part_size"},
		{spec: "s3://b-b?concurrency=0", errWith: "concurrency"},
		{spec: "s3://b-b?concurrency=1000", errWith: "concurrency"},
		{spec: "s3://b-b?endpoint=127.0.0.1:9000", errWith: "endpoint"},
		{spec: "s3://b-b?region=a&region=b", errWith: "region given 2 times"},
		{spec: "s3://b-b#frag", errWith: "fragment"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := parse(tc.spec)
			if tc.errWith != "" {
				if err == nil || !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.errWith) {
					t.Fatalf("parse = %+v, %v; want an ErrInvalid error with %q", got, err, tc.errWith)
				}
				if !strings.Contains(err.Error(), "s3://bucket") {
					t.Errorf("error %q does not show what a valid spec looks like", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if got.dir != tc.dir || !reflect.DeepEqual(got.s3, tc.s3) {
				t.Errorf("parse = dir %q s3 %+v, want dir %q s3 %+v", got.dir, got.s3, tc.dir, tc.s3)
			}
		})
	}
}

func TestOpenLocal(t *testing.T) {
	root := filepath.Join(t.TempDir(), "blobs")
	for _, spec := range []string{root, "file://" + root} {
		s, err := Open(testenv.Ctx(t), spec)
		if err != nil {
			t.Fatalf("Open(%q): %v", spec, err)
		}
		d, ok := s.(*localdir.Dir)
		if !ok || d.Root() != root {
			t.Errorf("Open(%q) = %T %v, want a localdir.Dir at %s", spec, s, s, root)
		}
	}
}

// TestOpenS3 opens a real MinIO through a spec, with the credentials in
// the environment as in production, and round-trips an object.
func TestOpenS3(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	s, err := Open(ctx, "s3://open-test/pfx?endpoint="+srv.Endpoint+"&path_style=true&part_size=5MiB&concurrency=2")
	if err != nil {
		t.Fatal(err)
	}
	st, ok := s.(*s3store.Store)
	if !ok {
		t.Fatalf("Open = %T, want *s3store.Store", s)
	}
	if err := st.EnsureBucket(ctx); err != nil {
		t.Fatal(err)
	}
	data := []byte("through the spec")
	if _, err := s.Put(ctx, "k", bytes.NewReader(data), -1); err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if got, _ := io.ReadAll(rc); !bytes.Equal(got, data) {
		t.Errorf("Get = %q, want %q", got, data)
	}
}
