package s3store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/blobtest"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/miniosrv"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// newStore returns a store in a new bucket of srv with the smallest part
// size S3 allows, so that the suite's large objects take several parts. When
// the test ends it checks that no multipart upload was left in the bucket
// (MinIO lists a whole bucket's uploads, though not those under a partial
// prefix, hence a bucket per store).
func newStore(t *testing.T, srv *miniosrv.Server, prefix string) *Store {
	t.Helper()
	ctx := testenv.Ctx(t)
	s, err := New(ctx, Config{
		Endpoint:    srv.Endpoint,
		Bucket:      "t-" + randomHex(8),
		Prefix:      prefix,
		AccessKey:   srv.AccessKey,
		SecretKey:   srv.SecretKey,
		PathStyle:   true,
		PartSize:    MinPartSize,
		Concurrency: 3,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.EnsureBucket(ctx); err != nil {
		t.Fatalf("EnsureBucket: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := s.client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(s.cfg.Bucket)})
		if err != nil {
			t.Errorf("ListMultipartUploads: %v", err)
			return
		}
		for _, u := range out.Uploads {
			t.Errorf("multipart upload %s of %s left behind", aws.ToString(u.UploadId), aws.ToString(u.Key))
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	srv := testenv.MinIO(t)
	for _, prefix := range []string{"", "/torpor/snapshots/"} {
		t.Run(fmt.Sprintf("prefix=%q", prefix), func(t *testing.T) {
			blobtest.Run(t, func(t *testing.T) blob.Store { return newStore(t, srv, prefix) })
		})
	}
}

// TestPrefixIsolation checks that a store sees and touches only its prefix,
// and skips objects under it whose names are not valid keys.
func TestPrefixIsolation(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	s := newStore(t, srv, "mine")
	raw := func(key string) {
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key), Body: strings.NewReader("foreign"),
		})
		if err != nil {
			t.Fatalf("raw PutObject %s: %v", key, err)
		}
	}
	for _, k := range []string{"other/a", "mine-not/a", "mine/bad key", "a"} {
		raw(k)
	}
	if _, err := s.Put(ctx, "a", strings.NewReader("mine"), 4); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Key != "a" || list[0].Size != 4 {
		t.Errorf("List = %+v, want only a of 4 bytes", list)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String("a")}); err != nil {
		t.Errorf("the object a outside the prefix is gone: %v", err)
	}
}

// TestPartsUploadInParallel slows every part upload down and checks that
// Concurrency of them, and no more, are in flight at once.
func TestPartsUploadInParallel(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	s := newStore(t, srv, "")
	var mu sync.Mutex
	inFlight, most, parts := 0, 0, 0
	s.client = withHook(s.client, func(in any) error {
		if _, ok := in.(*s3.UploadPartInput); !ok {
			return nil
		}
		mu.Lock()
		inFlight++
		parts++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // keep the part in flight while the next are read
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	})
	data := bytes.Repeat([]byte("0123456789abcdef"), (6*MinPartSize+100)/16)
	if _, err := s.Put(ctx, "par", bytes.NewReader(data), -1); err != nil {
		t.Fatal(err)
	}
	if parts != 7 || most != s.cfg.Concurrency {
		t.Errorf("%d parts, at most %d in flight; want 7 parts, %d in flight", parts, most, s.cfg.Concurrency)
	}
}

// TestFailedPartAborts fails one part's upload and checks that the Put
// fails with that error, stores nothing and (in newStore's cleanup) leaves
// no upload behind.
func TestFailedPartAborts(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	s := newStore(t, srv, "")
	boom := errors.New("part 3 failed")
	s.client = withHook(s.client, func(in any) error {
		if p, ok := in.(*s3.UploadPartInput); ok && aws.ToInt32(p.PartNumber) == 3 {
			return boom
		}
		return nil
	})
	data := make([]byte, 5*MinPartSize)
	_, err := s.Put(ctx, "fail", bytes.NewReader(data), int64(len(data)))
	if !errors.Is(err, boom) {
		t.Errorf("Put = %v, want the part's error", err)
	}
	if _, err := s.Stat(ctx, "fail"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after a failed Put: %v, want ErrNotFound", err)
	}
}

// withHook returns a copy of c that calls hook with each operation's input
// before sending it, and fails the operation if hook fails.
func withHook(c *s3.Client, hook func(in any) error) *s3.Client {
	return s3.New(c.Options(), func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Initialize.Add(middleware.InitializeMiddlewareFunc("testHook",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					if err := hook(in.Parameters); err != nil {
						return middleware.InitializeOutput{}, middleware.Metadata{}, err
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		})
	})
}

func TestErrorClasses(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	for _, tc := range []struct {
		name  string
		cfg   Config
		class error
	}{
		{"missing bucket", Config{Endpoint: srv.Endpoint, Bucket: "no-such-bucket", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PathStyle: true}, errdefs.ErrUnavailable},
		{"nothing listening", Config{Endpoint: "http://127.0.0.1:1", Bucket: "b-b", AccessKey: "a", SecretKey: "b", PathStyle: true}, errdefs.ErrUnavailable},
		{"wrong secret", Config{Endpoint: srv.Endpoint, Bucket: "b-b", AccessKey: srv.AccessKey, SecretKey: "wrong-secret", PathStyle: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(ctx, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Get, not Stat: a HEAD response has no body, so a missing
			// bucket looks like a missing key to Stat.
			_, _, err = s.Get(ctx, "k")
			if err == nil || errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("Get = %v, want an error that is not ErrNotFound", err)
			}
			if tc.class != nil && !errors.Is(err, tc.class) {
				t.Errorf("Get = %v, want %v", err, tc.class)
			}
			t.Logf("%v", err)
		})
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Bucket: "snapshots"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"all set", func(c *Config) {
			*c = Config{Endpoint: "https://s3.example.com:9000", Region: "eu-west-1", Bucket: "my.bucket-1", Prefix: "/a/b/",
				AccessKey: "k", SecretKey: "s", PathStyle: true, PartSize: 64 << 20, Concurrency: 16}
		}, true},
		{"no bucket", func(c *Config) { c.Bucket = "" }, false},
		{"short bucket", func(c *Config) { c.Bucket = "ab" }, false},
		{"upper-case bucket", func(c *Config) { c.Bucket = "Snapshots" }, false},
		{"bucket ends in dash", func(c *Config) { c.Bucket = "snap-" }, false},
		{"bucket with ..", func(c *Config) { c.Bucket = "a..b" }, false},
		{"endpoint without scheme", func(c *Config) { c.Endpoint = "127.0.0.1:9000" }, false},
		{"endpoint ftp", func(c *Config) { c.Endpoint = "ftp://h" }, false},
		{"bad prefix", func(c *Config) { c.Prefix = "a b" }, false},
		{"prefix with ..", func(c *Config) { c.Prefix = "a/../b" }, false},
		{"access key only", func(c *Config) { c.AccessKey = "k" }, false},
		{"part too small", func(c *Config) { c.PartSize = MinPartSize - 1 }, false},
		{"part too large", func(c *Config) { c.PartSize = MaxPartSize + 1 }, false},
		{"concurrency negative", func(c *Config) { c.Concurrency = -1 }, false},
		{"concurrency too high", func(c *Config) { c.Concurrency = MaxConcurrency + 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if (err == nil) != tc.ok || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestPartSizeFor(t *testing.T) {
	s := &Store{cfg: Config{PartSize: DefaultPartSize}}
	for _, tc := range []struct {
		size, want int64
		ok         bool
	}{
		{-1, DefaultPartSize, true},
		{0, DefaultPartSize, true},
		{DefaultPartSize * maxParts, DefaultPartSize, true},
		{DefaultPartSize*maxParts + 1, DefaultPartSize + 1, true},
		{MaxPartSize * maxParts, MaxPartSize, true},
		{MaxPartSize*maxParts + 1, 0, false},
	} {
		got, err := s.partSizeFor("k", tc.size)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("partSizeFor(%d) = %d, %v; want %d, ok=%v", tc.size, got, err, tc.want, tc.ok)
		}
	}
}

func TestRangeTotal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"bytes 0-99/1234", 1234, true},
		{"bytes 5-5/6", 6, true},
		{"bytes */1234", 1234, true},
		{"", 0, false},
		{"bytes 0-99/*", 0, false},
		{"items 0-1/2", 0, false},
	} {
		got, ok := rangeTotal(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("rangeTotal(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestEnsureBucket creates buckets twice over (the second call finds them),
// also outside the default region, which needs a location constraint.
func TestEnsureBucket(t *testing.T) {
	srv := testenv.MinIO(t)
	ctx := testenv.Ctx(t)
	for _, region := range []string{"", "eu-west-1"} {
		s, err := New(ctx, Config{Endpoint: srv.Endpoint, Region: region, Bucket: "eb-" + randomHex(4),
			AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PathStyle: true})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.EnsureBucket(ctx); err != nil {
				t.Fatalf("EnsureBucket (region %q): %v", region, err)
			}
		}
		if _, err := s.Put(ctx, "k", strings.NewReader("x"), 1); err != nil {
			t.Errorf("Put into the new bucket (region %q): %v", region, err)
		}
	}
}
