package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// MinPrefix is the fewest hex digits Resolve accepts as an ID prefix.
const MinPrefix = 4

// listConcurrency bounds the manifests List fetches at once.
const listConcurrency = 8

// Summary is one image as List reports it.
type Summary struct {
	ID string
	// Manifest is as stored; its signature is not checked (List has no
	// key), only that it hashes to ID.
	Manifest Manifest
	// Err says why the manifest could not be used (it does not hash to its
	// name or does not decode); Manifest is then zero. Delete removes such
	// an image.
	Err string
}

// fetchManifest loads the manifest of hexID and checks it hashes to it.
func fetchManifest(ctx context.Context, store blob.Store, hexID string) (Manifest, error) {
	id := IDPrefix + hexID
	b, err := getManifest(ctx, store, hexID)
	if err != nil {
		return Manifest{}, err
	}
	if idOf(b) != id {
		return Manifest{}, refuse(ErrCorrupt, nil, "snapshot %s: manifest digest mismatch (the stored manifest was modified)", id)
	}
	return parseManifest(id, b)
}

// getManifest returns the stored bytes of a manifest, bounded.
func getManifest(ctx context.Context, store blob.Store, hexID string) ([]byte, error) {
	id := IDPrefix + hexID
	rc, _, err := store.Get(ctx, manifestKey(hexID))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, refuse(errdefs.ErrNotFound, nil, "snapshot %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: get manifest: %w", id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: read manifest: %w", id, err)
	}
	if len(b) > MaxManifestBytes {
		return nil, refuse(ErrCorrupt, nil, "snapshot %s: manifest is larger than %d bytes", id, MaxManifestBytes)
	}
	return b, nil
}

// Stat returns the manifest of image id after checking that it hashes to
// id (ErrCorrupt otherwise). It does not check the signature: Read does.
func Stat(ctx context.Context, store blob.Store, id string) (Manifest, error) {
	h, err := parseID(id)
	if err != nil {
		return Manifest{}, err
	}
	return fetchManifest(ctx, store, h)
}

// List returns every image in the store, oldest first. An image whose
// manifest is damaged is listed with Err set; an error reaching the store
// fails the whole List.
func List(ctx context.Context, store blob.Store) ([]Summary, error) {
	infos, err := store.List(ctx, ManifestPrefix)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out := make([]Summary, len(infos))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	for i, info := range infos {
		h := strings.TrimPrefix(info.Key, ManifestPrefix)
		out[i].ID = IDPrefix + h
		if len(h) != 64 || !isHex(h) {
			out[i].Err = fmt.Sprintf("%s is not named by a sha256", info.Key)
			continue
		}
		g.Go(func() error {
			m, err := fetchManifest(gctx, store, h)
			switch {
			case err == nil:
				out[i].Manifest = m
			case IsRefused(err):
				out[i].Err = err.Error()
			case errors.Is(err, errdefs.ErrNotFound):
				out[i].Err = "deleted while listing"
			default:
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out = slices.DeleteFunc(out, func(s Summary) bool { return s.Err == "deleted while listing" })
	slices.SortStableFunc(out, func(a, b Summary) int {
		if c := a.Manifest.CreatedAt.Compare(b.Manifest.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Resolve turns a snapshot ID, or a unique prefix of its hex digits (at
// least MinPrefix, with or without "sha256:"), into the full ID, as docker
// does for image IDs. No match is ErrNotFound; several are ErrConflict.
func Resolve(ctx context.Context, store blob.Store, ref string) (string, error) {
	h := trimIDPrefix(ref)
	if len(h) < MinPrefix || len(h) > 64 || !isHex(h) {
		return "", errdefs.Invalid(fmt.Sprintf("snapshot reference %.80q: give a snapshot id or at least %d of its lowercase hex digits", ref, MinPrefix))
	}
	if len(h) == 64 {
		if _, err := store.Stat(ctx, manifestKey(h)); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return "", refuse(errdefs.ErrNotFound, nil, "snapshot %s%s not found", IDPrefix, h)
			}
			return "", fmt.Errorf("resolve snapshot %s: %w", ref, err)
		}
		return IDPrefix + h, nil
	}
	infos, err := store.List(ctx, ManifestPrefix+h)
	if err != nil {
		return "", fmt.Errorf("resolve snapshot %s: %w", ref, err)
	}
	var ids []string
	for _, info := range infos {
		if name := strings.TrimPrefix(info.Key, ManifestPrefix); len(name) == 64 && isHex(name) {
			ids = append(ids, IDPrefix+name)
		}
	}
	switch len(ids) {
	case 0:
		return "", refuse(errdefs.ErrNotFound, nil, "no snapshot id starts with %s", h)
	case 1:
		return ids[0], nil
	}
	return "", refuse(errdefs.ErrConflict, nil, "snapshot prefix %s is ambiguous: %d snapshots match; give more digits", h, len(ids))
}

// Delete removes image id: the manifest first, so that the image is gone
// at once, then its data. A damaged manifest is removed too; its data, if
// any, is left to GC. A missing image is ErrNotFound.
func Delete(ctx context.Context, store blob.Store, id string) error {
	h, err := parseID(id)
	if err != nil {
		return err
	}
	m, err := fetchManifest(ctx, store, h)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	if err := store.Delete(ctx, manifestKey(h)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if m.DataKey == "" || !strings.HasPrefix(m.DataKey, DataPrefix) || blob.ValidateKey(m.DataKey) != nil {
		return nil
	}
	if err := store.Delete(ctx, m.DataKey); err != nil {
		return fmt.Errorf("delete snapshot %s: data (GC will retry): %w", id, err)
	}
	return nil
}

// GC deletes the data objects that no manifest names and that were last
// modified before olderThan, and returns their keys. Such objects are left
// by writes that died between data and manifest, and by failed deletes.
//
// olderThan must lie further in the past than the longest upload takes (an
// hour is plenty): the data of a write in flight has no manifest yet.
// Manifests are read leniently, so that GC on an old node does not delete
// the data of images in a newer format; if any manifest cannot be fetched,
// GC deletes nothing.
func GC(ctx context.Context, store blob.Store, olderThan time.Time) ([]string, error) {
	manifests, err := store.List(ctx, ManifestPrefix)
	if err != nil {
		return nil, fmt.Errorf("snapshot gc: %w", err)
	}
	refs := make(map[string]bool, len(manifests))
	for _, info := range manifests {
		b, err := getManifest(ctx, store, strings.TrimPrefix(info.Key, ManifestPrefix))
		switch {
		case errors.Is(err, errdefs.ErrNotFound) || IsRefused(err):
			continue // deleted meanwhile, or too large to be an image
		case err != nil:
			return nil, fmt.Errorf("snapshot gc: %w", err)
		}
		var ref struct {
			DataKey string `json:"data_key"`
		}
		if json.Unmarshal(b, &ref) == nil && ref.DataKey != "" {
			refs[ref.DataKey] = true
		}
	}
	data, err := store.List(ctx, DataPrefix)
	if err != nil {
		return nil, fmt.Errorf("snapshot gc: %w", err)
	}
	var removed []string
	for _, d := range data {
		if refs[d.Key] || !d.ModTime.Before(olderThan) {
			continue
		}
		if err := store.Delete(ctx, d.Key); err != nil {
			return removed, fmt.Errorf("snapshot gc: %w", err)
		}
		removed = append(removed, d.Key)
	}
	return removed, nil
}
