// Package s3store is the blob store of a cluster: a bucket (and key prefix)
// in AWS S3 or any S3-compatible store such as MinIO. It owns the objects
// under its prefix and the multipart uploads it starts; it does not create
// buckets unless asked (EnsureBucket) and never touches keys outside its
// prefix.
//
// Puts larger than one part are uploaded as parallel multipart uploads,
// which S3 makes visible only on completion; every failed upload is aborted,
// so that no partial object is visible and no parts linger to be billed.
package s3store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Store is a blob.Store in an S3 bucket. It is safe for concurrent use.
type Store struct {
	client *s3.Client
	cfg    Config // with defaults
	prefix string // cfg.Prefix without outer slashes, plus "/"; or ""
	bufs   sync.Pool
}

var _ blob.Store = (*Store)(nil)

// String names the store as an s3:// URL, for messages.
func (s *Store) String() string {
	return "s3://" + s.cfg.Bucket + "/" + s.prefix
}

// full is the object key of key in the bucket.
func (s *Store) full(key string) string { return s.prefix + key }

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, blob.Info{}, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.full(key)),
	})
	if err != nil {
		return nil, blob.Info{}, s.classify("get", key, err)
	}
	return out.Body, blob.Info{
		Key:     key,
		Size:    aws.ToInt64(out.ContentLength),
		ModTime: aws.ToTime(out.LastModified),
	}, nil
}

// GetRange implements blob.Store. S3 clips a range that runs past the end
// and refuses one that starts at it (even for an empty range on an empty
// object), so both cases are settled here against the object's size, as
// blob.CheckRange defines them.
func (s *Store) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	if offset < 0 || length == 0 {
		return s.emptyRange(ctx, key, offset, length)
	}
	rng := fmt.Sprintf("bytes=%d-", offset)
	if length > 0 {
		rng += strconv.FormatInt(offset+length-1, 10)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.full(key)),
		Range:  aws.String(rng),
	})
	if err != nil {
		if isInvalidRange(err) {
			return s.emptyRange(ctx, key, offset, length)
		}
		return nil, s.classify("get", key, err)
	}
	size, ok := rangeTotal(aws.ToString(out.ContentRange))
	if !ok {
		out.Body.Close()
		return nil, fmt.Errorf("get blob %s from %s: range %s answered with Content-Range %q, want bytes a-b/size; does the store support ranges?",
			key, s, rng, aws.ToString(out.ContentRange))
	}
	if _, err := blob.CheckRange(key, offset, length, size); err != nil {
		out.Body.Close()
		return nil, err
	}
	return out.Body, nil
}

// emptyRange answers the ranges that S3 cannot: it checks the range
// against the object's size and returns an empty reader if it is valid.
func (s *Store) emptyRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	info, err := s.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	n, err := blob.CheckRange(key, offset, length, info.Size)
	if err != nil {
		return nil, err
	}
	if n != 0 {
		// S3 refused a range that the size says is fine: the object must
		// have been replaced between the two requests.
		return nil, fmt.Errorf("get blob %s from %s: range %d+%d: the object changed while it was read; retry: %w",
			key, s, offset, length, errdefs.ErrConflict)
	}
	return io.NopCloser(strings.NewReader("")), nil
}

// rangeTotal parses the object size out of a Content-Range header,
// "bytes 0-99/1234".
func rangeTotal(cr string) (int64, bool) {
	i := strings.LastIndexByte(cr, '/')
	if !strings.HasPrefix(cr, "bytes ") || i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(cr[i+1:], 10, 64)
	return n, err == nil
}

func isInvalidRange(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "InvalidRange" {
		return true
	}
	return httpStatus(err) == 416
}

// Stat implements blob.Store. It sends a HEAD request, whose 404 has no
// body to tell a missing key from a missing bucket: Stat reports both as
// ErrNotFound, where Get and List say the bucket is missing.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.full(key)),
	})
	if err != nil {
		return blob.Info{}, s.classify("stat", key, err)
	}
	return blob.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.full(key)),
	})
	if err != nil && !isNotFound(err) {
		return s.classify("delete", key, err)
	}
	return nil
}

// List implements blob.Store. Objects under the prefix whose names are not
// valid keys (written by something else) are skipped.
func (s *Store) List(ctx context.Context, prefix string) ([]blob.Info, error) {
	if err := blob.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	var out []blob.Info
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.cfg.Bucket),
		Prefix: aws.String(s.full(prefix)),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s.classify("list", prefix+"*", err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if blob.ValidateKey(key) != nil {
				continue
			}
			out = append(out, blob.Info{Key: key, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)})
		}
	}
	// S3 lists in UTF-8 byte order, which for key characters is Go's
	// string order; sorting anyway makes the contract not depend on it.
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// classify wraps an SDK error from op on key with the errdefs class it
// belongs to, and says what to do where that is clear.
func (s *Store) classify(op, key string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s blob %s in %s: %w", op, key, s, err)
	}
	code := ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	status := httpStatus(err)
	var ne net.Error
	switch {
	case code == "NoSuchBucket":
		return fmt.Errorf("%s blob %s: bucket %s does not exist; create it (torpor can, see EnsureBucket): %w: %w",
			op, key, s.cfg.Bucket, errdefs.ErrUnavailable, err)
	case code == "NoSuchKey" || code == "NotFound" || status == 404:
		return errdefs.NotFound(fmt.Sprintf("blob %s not found in %s", key, s))
	case code == "InvalidRange" || status == 416:
		return fmt.Errorf("%s blob %s in %s: %w: %w", op, key, s, errdefs.ErrInvalid, err)
	case code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch":
		return fmt.Errorf("%s blob %s in %s: check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the bucket policy: %w",
			op, key, s, err)
	case status >= 500 || code == "SlowDown" || errors.As(err, &ne):
		return fmt.Errorf("%s blob %s in %s: %w: %w", op, key, s, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("%s blob %s in %s: %w", op, key, s, err)
}
