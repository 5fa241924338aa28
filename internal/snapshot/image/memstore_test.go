package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// memStore is an in-memory blob.Store test double: a map under a mutex,
// with an atomic Put (the object appears only once the stream was read
// whole). The real backends are tested by the blob conformance suite.
type memStore struct {
	mu   sync.Mutex
	objs map[string]memObj
	// failPut, if set, may fail a Put of key after its stream was read.
	failPut func(key string) error
	// hideSize makes Get report an unknown size (-1), as a streaming
	// backend might, so that Read must notice truncation while reading.
	hideSize bool
	// failRange, if set, may fail a GetRange (a network error).
	failRange func(offset int64) error
}

type memObj struct {
	data []byte
	mod  time.Time
}

var _ blob.Store = (*memStore)(nil)

func newMemStore() *memStore { return &memStore{objs: map[string]memObj{}} }

func (s *memStore) Put(ctx context.Context, key string, r io.Reader, size int64) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return blob.Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return blob.Info{}, err
	}
	if size >= 0 && int64(len(data)) != size {
		return blob.Info{}, errdefs.Invalid(fmt.Sprintf("put %s: %d bytes, size said %d", key, len(data), size))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut != nil {
		if err := s.failPut(key); err != nil {
			return blob.Info{}, err
		}
	}
	o := memObj{data: data, mod: time.Now()}
	s.objs[key] = o
	return blob.Info{Key: key, Size: int64(len(data)), ModTime: o.mod}, nil
}

func (s *memStore) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return nil, blob.Info{}, errdefs.NotFound("blob " + key + " not found")
	}
	info := blob.Info{Key: key, Size: int64(len(o.data)), ModTime: o.mod}
	if s.hideSize {
		info.Size = -1
	}
	return io.NopCloser(bytes.NewReader(o.data)), info, nil
}

func (s *memStore) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return nil, errdefs.NotFound("blob " + key + " not found")
	}
	if s.failRange != nil {
		if err := s.failRange(offset); err != nil {
			return nil, err
		}
	}
	if offset < 0 || offset > int64(len(o.data)) {
		return nil, errdefs.Invalid("range past the end")
	}
	end := int64(len(o.data))
	if length >= 0 {
		end = min(end, offset+length)
	}
	return io.NopCloser(bytes.NewReader(o.data[offset:end])), nil
}

func (s *memStore) Stat(ctx context.Context, key string) (blob.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return blob.Info{}, errdefs.NotFound("blob " + key + " not found")
	}
	info := blob.Info{Key: key, Size: int64(len(o.data)), ModTime: o.mod}
	if s.hideSize {
		info.Size = -1
	}
	return info, nil
}

func (s *memStore) Delete(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
	return nil
}

func (s *memStore) List(ctx context.Context, prefix string) ([]blob.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []blob.Info
	for k, o := range s.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, blob.Info{Key: k, Size: int64(len(o.data)), ModTime: o.mod})
		}
	}
	slices.SortFunc(out, func(a, b blob.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Test helpers.

func (s *memStore) keys() []string {
	infos, _ := s.List(context.Background(), "")
	var keys []string
	for _, i := range infos {
		keys = append(keys, i.Key)
	}
	return keys
}

func (s *memStore) get(t testing.TB, key string) []byte {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		t.Fatalf("no object %s", key)
	}
	return bytes.Clone(o.data)
}

func (s *memStore) set(key string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs[key] = memObj{data: data, mod: time.Now()}
}

func (s *memStore) setModTime(key string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.objs[key]
	o.mod = t
	s.objs[key] = o
}
