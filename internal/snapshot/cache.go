package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/torpor-dev/torpor/internal/snapshot/image"
)

// imageCache keeps verified, unpacked images in memory (a tmpfs) so that a
// snapshot restored again on this worker skips the download, verification
// and unpacking. Images are immutable and content-addressed, so a cached
// copy never goes stale. Beyond the byte budget the least recently used
// images that no restore is reading are dropped.
type imageCache struct {
	dir    string
	budget int64

	mu    sync.Mutex
	items map[string]*cachedImage
	used  int64
	load  singleflight.Group
}

type cachedImage struct {
	id       string
	dir      string
	manifest image.Manifest
	size     int64
	lastUsed time.Time
	refs     int  // restores reading it now
	dropped  bool // out of the cache; removed when refs reaches 0
}

func newImageCache(dir string, budget int64) (*imageCache, error) {
	if err := os.RemoveAll(dir); err != nil { // a previous run's: not accounted for
		return nil, fmt.Errorf("image cache: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	return &imageCache{dir: dir, budget: budget, items: map[string]*cachedImage{}}, nil
}

// get returns the unpacked image id, unpacking it with read into a new
// directory on a miss. The caller must release it.
func (c *imageCache) get(ctx context.Context, id string, read func(dir string) (image.Manifest, image.Stats, error)) (*cachedImage, image.Stats, bool, error) {
	c.mu.Lock()
	if ci, ok := c.items[id]; ok {
		ci.refs++
		ci.lastUsed = time.Now()
		c.mu.Unlock()
		return ci, image.Stats{}, true, nil
	}
	c.mu.Unlock()
	type loaded struct {
		ci *cachedImage
		st image.Stats
	}
	v, err, _ := c.load.Do(id, func() (any, error) {
		dir := filepath.Join(c.dir, strings.TrimPrefix(id, image.IDPrefix)+"-"+randomHex())
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		m, st, err := read(dir)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		ci := &cachedImage{id: id, dir: dir, manifest: m, size: m.RawSize, lastUsed: time.Now()}
		c.mu.Lock()
		defer c.mu.Unlock()
		if ci.size > c.budget {
			ci.dropped = true // used once, by the callers sharing this load
		} else {
			c.items[id] = ci
			c.used += ci.size
		}
		return loaded{ci, st}, nil
	})
	if err != nil {
		return nil, image.Stats{}, false, err
	}
	l := v.(loaded)
	c.mu.Lock()
	l.ci.refs++
	c.evictLocked()
	c.mu.Unlock()
	return l.ci, l.st, false, nil
}

// release ends a restore's use of ci.
func (c *imageCache) release(ci *cachedImage) {
	c.mu.Lock()
	ci.refs--
	remove := ci.dropped && ci.refs == 0
	c.evictLocked()
	c.mu.Unlock()
	if remove {
		os.RemoveAll(ci.dir)
	}
}

// evictLocked drops unused images, least recently used first, until the
// cache fits its budget (c.mu held; directories removed in the background
// since nothing refers to them).
func (c *imageCache) evictLocked() {
	if c.used <= c.budget {
		return
	}
	var idle []*cachedImage
	for _, ci := range c.items {
		if ci.refs == 0 {
			idle = append(idle, ci)
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].lastUsed.Before(idle[j].lastUsed) })
	for _, ci := range idle {
		if c.used <= c.budget {
			break
		}
		delete(c.items, ci.id)
		c.used -= ci.size
		ci.dropped = true
		go os.RemoveAll(ci.dir)
	}
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// close drops every image and removes the cache directory.
func (c *imageCache) close() error {
	c.mu.Lock()
	c.items, c.used = map[string]*cachedImage{}, 0
	c.mu.Unlock()
	return os.RemoveAll(c.dir)
}
