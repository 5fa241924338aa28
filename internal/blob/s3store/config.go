package s3store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults and limits of Config. The part-size limits and the part count
// are S3's own; MinIO and the other compatible stores keep them.
const (
	DefaultRegion      = "us-east-1"
	DefaultPartSize    = 8 << 20
	MinPartSize        = 5 << 20
	MaxPartSize        = 5 << 30
	DefaultConcurrency = 4
	MaxConcurrency     = 64
	maxParts           = 10000
)

// Config says which bucket to use and how to talk to it. The zero value of
// every field but Bucket means its default.
type Config struct {
	// Endpoint is the store's base URL, e.g. http://127.0.0.1:9000 for a
	// local MinIO; empty means AWS S3 itself.
	Endpoint string
	// Region defaults to us-east-1, which MinIO accepts whatever its own.
	Region string
	// Bucket holds the objects; it must exist (see EnsureBucket).
	Bucket string
	// Prefix is prepended to every key, so that several stores (or other
	// data) can share a bucket; slashes around it do not matter.
	Prefix string
	// AccessKey and SecretKey are static credentials. When both are empty
	// the SDK's default chain applies (AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY, shared config files, instance roles).
	AccessKey string
	SecretKey string
	// PathStyle addresses the bucket as a path (http://host/bucket/key)
	// rather than a host name (http://bucket.host/key); MinIO needs it.
	PathStyle bool
	// PartSize is the multipart part size and the largest object stored in
	// one request: 8 MiB by default, at least 5 MiB. An object of known
	// size that would need more than 10,000 parts gets bigger parts.
	PartSize int64
	// Concurrency is how many parts of one Put upload at once (default 4).
	// A Put holds at most Concurrency+1 part buffers in memory.
	Concurrency int
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Region == "" {
		c.Region = DefaultRegion
	}
	if c.PartSize == 0 {
		c.PartSize = DefaultPartSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// Validate checks c (after defaults) and returns an ErrInvalid error naming
// the first bad field.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := validateBucket(c.Bucket); err != nil {
		return err
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errdefs.Invalid(fmt.Sprintf("s3 endpoint %q: want an http:// or https:// URL with a host, like http://127.0.0.1:9000", c.Endpoint))
		}
	}
	if p := strings.Trim(c.Prefix, "/"); p != "" {
		if err := blob.ValidateKey(p); err != nil {
			return fmt.Errorf("s3 prefix %q: %w", c.Prefix, err)
		}
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		return errdefs.Invalid("s3 credentials: give both an access key and a secret key, or neither to use the environment")
	}
	if c.PartSize < MinPartSize || c.PartSize > MaxPartSize {
		return errdefs.Invalid(fmt.Sprintf("s3 part size %d: must be between %d (5 MiB) and %d (5 GiB)", c.PartSize, MinPartSize, int64(MaxPartSize)))
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		return errdefs.Invalid(fmt.Sprintf("s3 concurrency %d: must be between 1 and %d", c.Concurrency, MaxConcurrency))
	}
	return nil
}

// validateBucket applies S3's bucket naming rules (the ones every
// compatible store shares), so that a typo fails here and not as an opaque
// signature or DNS error.
func validateBucket(b string) error {
	bad := len(b) < 3 || len(b) > 63
	for i, c := range b {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && ((c != '-' && c != '.') || i == 0 || i == len(b)-1) {
			bad = true
		}
	}
	if bad || strings.Contains(b, "..") {
		return errdefs.Invalid(fmt.Sprintf("s3 bucket %q: want 3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit", b))
	}
	return nil
}

// New returns a Store over the bucket cfg names. It does not contact the
// store: a wrong endpoint or missing bucket shows in the first call (or in
// EnsureBucket).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.AccessKey != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 store %s: load AWS configuration: %w", cfg.Bucket, err)
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// Send and check checksums only where S3 requires them: the
		// SDK's default adds CRC headers that older S3-compatible stores
		// reject, and TLS (or, on loopback, nothing) guards the bytes.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &Store{client: client, cfg: cfg, prefix: prefix}, nil
}

// EnsureBucket creates the bucket unless it exists. A bucket that exists
// but belongs to someone else is an ErrConflict error.
func (s *Store) EnsureBucket(ctx context.Context) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.cfg.Bucket)})
	if err == nil {
		return nil
	}
	if !isNotFound(err) {
		return s.classify("check bucket", s.cfg.Bucket, err)
	}
	in := &s3.CreateBucketInput{Bucket: aws.String(s.cfg.Bucket)}
	if s.cfg.Region != DefaultRegion {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{
			LocationConstraint: types.BucketLocationConstraint(s.cfg.Region),
		}
	}
	_, err = s.client.CreateBucket(ctx, in)
	var owned *types.BucketAlreadyOwnedByYou
	var taken *types.BucketAlreadyExists
	switch {
	case err == nil, errors.As(err, &owned):
		return nil
	case errors.As(err, &taken):
		return fmt.Errorf("create s3 bucket %s: the name belongs to another account; pick another: %w", s.cfg.Bucket, errdefs.ErrConflict)
	}
	return s.classify("create bucket", s.cfg.Bucket, err)
}

// isNotFound reports whether err says the object (or, from HeadBucket, the
// bucket) does not exist. HEAD responses have no body, so a 404 there comes
// without an error code.
func isNotFound(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound", "NoSuchBucket":
			return true
		}
	}
	return httpStatus(err) == 404
}

// httpStatus is err's HTTP status code, or 0 if it has none.
func httpStatus(err error) int {
	var hs interface{ HTTPStatusCode() int }
	if errors.As(err, &hs) {
		return hs.HTTPStatusCode()
	}
	return 0
}
