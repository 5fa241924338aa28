package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/torpor-dev/torpor/api"
)

// Snapshots lists the stored snapshots, newest first.
func (c *Client) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var out api.SnapshotList
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &out)
	return out.Snapshots, err
}

// Snapshot describes the snapshot ref (an id or a unique prefix).
func (c *Client) Snapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	var out api.Snapshot
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// DeleteSnapshot deletes the snapshot ref.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(ref), nil, nil, nil)
}

// CreateSnapshot asks a worker to snapshot an instance.
func (c *Client) CreateSnapshot(ctx context.Context, req api.SnapshotCreate) (api.SnapshotCreated, error) {
	var out api.SnapshotCreated
	body, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	err = c.doJSON(ctx, http.MethodPost, "/v1/snapshots", nil, body, &out)
	return out, err
}

// ExportSnapshot downloads the bundle of snapshot ref into w; progress,
// when not nil, is called with the bytes done and the total as they move.
func (c *Client) ExportSnapshot(ctx context.Context, ref string, w io.Writer, progress func(done, total int64)) (string, error) {
	resp, err := c.doStream(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(ref)+"/export", nil, nil, 0, "")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if progress != nil {
		r = &progressReader{r: r, total: resp.ContentLength, fn: progress}
	}
	n, err := io.Copy(w, r)
	if err != nil {
		return "", fmt.Errorf("export %s: %w", ref, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return "", fmt.Errorf("export %s: got %d of %d bytes: the gateway broke off (see its log)", ref, n, resp.ContentLength)
	}
	return resp.Header.Get("X-Torpor-Snapshot"), nil
}

// ImportSnapshot uploads a bundle of size bytes from r.
func (c *Client) ImportSnapshot(ctx context.Context, r io.Reader, size int64, progress func(done, total int64)) (api.Snapshot, error) {
	if progress != nil {
		r = &progressReader{r: r, total: size, fn: progress}
	}
	var out api.Snapshot
	resp, err := c.doStream(ctx, http.MethodPost, "/v1/snapshots/import", nil, r, size, "application/octet-stream")
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("import: decode the answer of %s: %w", c.base, err)
	}
	return out, nil
}

// progressReader reports the bytes read through it.
type progressReader struct {
	r     io.Reader
	done  int64
	total int64
	fn    func(done, total int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	p.fn(p.done, p.total)
	return n, err
}

// GCSnapshots removes unreferenced snapshot data older than olderThan.
func (c *Client) GCSnapshots(ctx context.Context, olderThan time.Duration) ([]string, error) {
	var out api.SnapshotGC
	q := url.Values{"older_than": {olderThan.String()}}
	err := c.doJSON(ctx, http.MethodPost, "/v1/snapshots/gc", q, nil, &out)
	return out.Removed, err
}
