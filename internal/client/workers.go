package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Workers lists the live workers and what each keeps warm, by id.
func (c *Client) Workers(ctx context.Context) ([]api.WorkerSummary, error) {
	var out api.WorkerList
	err := c.doJSON(ctx, http.MethodGet, "/v1/workers", nil, nil, &out)
	return out.Workers, err
}

// Worker asks worker id for its templates and instances and the memory of
// each process.
func (c *Client) Worker(ctx context.Context, id string) (api.WorkerInfo, error) {
	var out api.WorkerInfo
	if id == "" || id == "." || id == ".." {
		return out, errdefs.Invalid(fmt.Sprintf("invalid worker id %q: use an id `torpor workers` lists", id))
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/workers/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// Evict asks worker id to evict itself: stop taking calls, move its running
// calls to other workers within req.GraceMS (0: the worker's
// --eviction-grace) and exit. It returns once the worker has begun, with
// the calls it was running and the grace in effect.
func (c *Client) Evict(ctx context.Context, id string, req api.EvictRequest) (api.EvictReport, error) {
	var out api.EvictReport
	if id == "" || id == "." || id == ".." {
		return out, errdefs.Invalid(fmt.Sprintf("invalid worker id %q: use an id `torpor workers` lists", id))
	}
	body, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	err = c.doJSON(ctx, http.MethodPost, "/v1/workers/"+url.PathEscape(id)+"/evict", nil, body, &out)
	return out, err
}

// DropInstances stops the idle instances of name (version 0: of every
// version) on every worker and, unless keepTemplates, its function
// templates.
func (c *Client) DropInstances(ctx context.Context, name string, version int, keepTemplates bool) (api.DropResult, error) {
	var out api.DropResult
	if err := checkName(name); err != nil {
		return out, err
	}
	q := versionQuery(version)
	if keepTemplates {
		if q == nil {
			q = url.Values{}
		}
		q.Set("keep_templates", "true")
	}
	err := c.doJSON(ctx, http.MethodDelete, fnPath(name)+"/instances", q, nil, &out)
	return out, err
}
