package s3store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// abortTimeout bounds the AbortMultipartUpload of a failed Put. It runs on
// a fresh context, because the usual reason to abort is that the Put's own
// context was cancelled.
const abortTimeout = 15 * time.Second

// peekSize is the read-ahead that tells whether a stream has ended exactly
// at a part boundary. Parts are read straight into their buffers past it.
const peekSize = 64 << 10

// Put implements blob.Store. It reads the first part before deciding how
// to upload: an object that fits in one part (known size or not) goes up in
// one PutObject, anything larger as a parallel multipart upload. The
// returned ModTime is the local clock's; Stat gives the store's.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	partSize, err := s.partSizeFor(key, size)
	if err != nil {
		return blob.Info{}, err
	}
	src := blob.ContextReader(ctx, r)
	if size >= 0 {
		src = io.LimitReader(src, size+1) // one byte too many shows a wrong size without reading on
	}
	pr := &partReader{br: bufio.NewReaderSize(src, peekSize), size: size, key: key}

	first := s.getBuf(partSize)
	n, last, err := pr.next(first)
	if err != nil {
		s.putBuf(first)
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	if last {
		defer s.putBuf(first)
		return s.putSingle(ctx, key, first[:n])
	}
	return s.putMultipart(ctx, key, pr, partSize, first[:n])
}

// partSizeFor returns the part size for an object of size bytes (-1 if
// unknown): the configured one, or a larger one if size needs more than
// S3's 10,000 parts.
func (s *Store) partSizeFor(key string, size int64) (int64, error) {
	ps := s.cfg.PartSize
	if size > ps*maxParts {
		ps = (size + maxParts - 1) / maxParts
	}
	if ps > MaxPartSize {
		return 0, errdefs.TooLarge(fmt.Sprintf("put blob %s: %d bytes is more than S3's limit of %d parts of 5 GiB", key, size, maxParts))
	}
	return ps, nil
}

// partReader cuts a stream into parts and checks its length against the
// size the caller gave.
type partReader struct {
	br    *bufio.Reader
	size  int64 // -1 if unknown
	total int64 // bytes read so far
	key   string
}

// next fills buf with the next part and reports whether it is the last.
// A stream longer or shorter than a known size is an ErrInvalid error.
func (p *partReader) next(buf []byte) (n int, last bool, err error) {
	n, err = io.ReadFull(p.br, buf)
	p.total += int64(n)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		last = true
	case err != nil:
		return n, false, fmt.Errorf("read after %d bytes: %w", p.total, err)
	default:
		if _, err := p.br.Peek(1); errors.Is(err, io.EOF) {
			last = true
		} else if err != nil {
			return n, false, fmt.Errorf("read after %d bytes: %w", p.total, err)
		}
	}
	if p.size >= 0 && (p.total > p.size || last && p.total != p.size) {
		more := ""
		if p.total > p.size {
			more = "more than "
		}
		return n, last, errdefs.Invalid(fmt.Sprintf("put blob %s: the stream held %s%d bytes but its size was given as %d", p.key, more, p.total, p.size))
	}
	return n, last, nil
}

// getBuf takes a part buffer from the pool. Buffers of a non-default size
// (for objects too large for 10,000 default parts) are not pooled.
func (s *Store) getBuf(size int64) []byte {
	if size == s.cfg.PartSize {
		if b, ok := s.bufs.Get().(*[]byte); ok {
			return *b
		}
	}
	return make([]byte, size)
}

func (s *Store) putBuf(b []byte) {
	if int64(cap(b)) == s.cfg.PartSize {
		b = b[:cap(b)]
		s.bufs.Put(&b)
	}
}

// putSingle stores an object that fits in one request.
func (s *Store) putSingle(ctx context.Context, key string, data []byte) (blob.Info, error) {
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(s.cfg.Bucket),
		Key:           aws.String(s.full(key)),
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
	}, retryNamespaceRace)
	if err != nil {
		return blob.Info{}, s.classify("put", key, err)
	}
	return blob.Info{Key: key, Size: int64(len(data)), ModTime: time.Now()}, nil
}

// putMultipart uploads first and the rest of pr as a multipart upload, and
// aborts the upload if anything fails, so that neither an object nor parts
// are left behind.
func (s *Store) putMultipart(ctx context.Context, key string, pr *partReader, partSize int64, first []byte) (blob.Info, error) {
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.full(key)),
	})
	if err != nil {
		s.putBuf(first)
		return blob.Info{}, s.classify("start upload of", key, err)
	}
	id := aws.ToString(created.UploadId)
	parts, err := s.uploadParts(ctx, key, id, pr, partSize, first)
	if err == nil {
		// Do not complete an upload whose caller has given up: the object
		// would appear after Put returned an error.
		err = ctx.Err()
	}
	if err == nil {
		_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket:          aws.String(s.cfg.Bucket),
			Key:             aws.String(s.full(key)),
			UploadId:        aws.String(id),
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		}, retryNamespaceRace)
		if err != nil {
			err = s.classify("complete upload of", key, err)
		}
	}
	if err != nil {
		return blob.Info{}, errors.Join(fmt.Errorf("put blob %s: %w", key, err), s.abort(ctx, key, id))
	}
	return blob.Info{Key: key, Size: pr.total, ModTime: time.Now()}, nil
}

// uploadParts reads parts and uploads up to Concurrency of them at once.
// Memory stays at Concurrency+1 part buffers: the uploads in flight, and the
// one being filled, which waits for a free upload slot. It returns the
// completed parts in order.
func (s *Store) uploadParts(ctx context.Context, key, id string, pr *partReader, partSize int64, first []byte) ([]types.CompletedPart, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Concurrency)

	var mu sync.Mutex
	var parts []types.CompletedPart
	upload := func(num int32, buf []byte, n int) {
		g.Go(func() error {
			defer s.putBuf(buf)
			out, err := s.client.UploadPart(gctx, &s3.UploadPartInput{
				Bucket:        aws.String(s.cfg.Bucket),
				Key:           aws.String(s.full(key)),
				UploadId:      aws.String(id),
				PartNumber:    aws.Int32(num),
				Body:          bytes.NewReader(buf[:n]),
				ContentLength: aws.Int64(int64(n)),
			})
			if err != nil {
				return s.classify(fmt.Sprintf("upload part %d of", num), key, err)
			}
			mu.Lock()
			parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)})
			mu.Unlock()
			return nil
		})
	}

	upload(1, first, len(first))
	var readErr error
	for num := int32(2); gctx.Err() == nil; num++ {
		if num > maxParts {
			readErr = errdefs.TooLarge(fmt.Sprintf("put blob %s: the stream needs more than %d parts of %d bytes; give its size, so that parts can be larger",
				key, maxParts, partSize))
			break
		}
		buf := s.getBuf(partSize)
		n, last, err := pr.next(buf)
		if err != nil {
			s.putBuf(buf)
			readErr = err
			break
		}
		if n > 0 {
			upload(num, buf, n)
		} else {
			s.putBuf(buf)
		}
		if last {
			break
		}
	}
	if readErr != nil {
		cancel() // stop the uploads in flight: the upload is lost anyway
	}
	if err := g.Wait(); readErr == nil && err != nil {
		readErr = err
	}
	if readErr == nil {
		readErr = ctx.Err()
	}
	if readErr != nil {
		return nil, readErr
	}
	sort.Slice(parts, func(i, j int) bool { return aws.ToInt32(parts[i].PartNumber) < aws.ToInt32(parts[j].PartNumber) })
	return parts, nil
}

// retryNamespaceRace makes the requests that move an object into place
// (PutObject, CompleteMultipartUpload) also retry AccessDenied and NoSuchKey.
// MinIO on a file system answers with those when a Delete in the same
// "directory" removes it, emptied, under the rename's feet (it retries that
// only once itself: minio/minio#15157); torpor's tests hit it about once in
// thirty runs of 16 writers. A Put cannot otherwise meet NoSuchKey, and a
// real AccessDenied merely fails after the SDK's usual retries.
func retryNamespaceRace(o *s3.Options) {
	o.Retryer = retry.AddWithErrorCodes(o.Retryer, "AccessDenied", "NoSuchKey")
}

// abort aborts a multipart upload, so that its parts are freed. It uses a
// fresh context, since the Put's own may be what ended.
func (s *Store) abort(ctx context.Context, key, id string) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	_, err := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
		Bucket:   aws.String(s.cfg.Bucket),
		Key:      aws.String(s.full(key)),
		UploadId: aws.String(id),
	})
	if err != nil {
		var gone *types.NoSuchUpload
		if errors.As(err, &gone) {
			return nil
		}
		return fmt.Errorf("abort upload %s of blob %s (its parts stay until a bucket lifecycle rule removes them): %w", id, key, err)
	}
	return nil
}
