// Package blobopen turns a one-line store spec (a flag, an environment
// variable, a config value) into a blob.Store. It owns only the spec syntax;
// the stores live in localdir and s3store, and it must not grow a registry of
// backends: a new one is a new case here.
package blobopen

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/localdir"
	"github.com/torpor-dev/torpor/internal/blob/s3store"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Usage describes the valid specs; errors about a spec end with it.
const Usage = `a blob store spec is an absolute path or file:///abs/path (a local directory), ` +
	`or s3://bucket[/prefix][?endpoint=http://127.0.0.1:9000&region=us-east-1&path_style=true&part_size=8MiB&concurrency=4] ` +
	`(an S3-compatible store; credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)`

// Open opens the store spec names (see Usage). A local directory is created
// if missing; an S3 bucket must exist, and is not contacted until first use.
func Open(ctx context.Context, spec string) (blob.Store, error) {
	t, err := parse(spec)
	if err != nil {
		return nil, err
	}
	if t.s3 != nil {
		return s3store.New(ctx, *t.s3)
	}
	return localdir.New(t.dir)
}

// target is a parsed spec: a directory or an S3 configuration.
type target struct {
	dir string
	s3  *s3store.Config
}

// badSpec is the ErrInvalid error for spec, saying which part is wrong.
func badSpec(spec, format string, args ...any) error {
	return errdefs.Invalid(fmt.Sprintf("blob store %q: %s; %s", spec, fmt.Sprintf(format, args...), Usage))
}

func parse(spec string) (target, error) {
	switch {
	case spec == "":
		return target{}, badSpec(spec, "empty")
	case strings.HasPrefix(spec, "/"):
		return target{dir: filepath.Clean(spec)}, nil
	case strings.HasPrefix(spec, "file:"):
		return parseFile(spec)
	case strings.HasPrefix(spec, "s3:"):
		return parseS3(spec)
	}
	if i := strings.Index(spec, "://"); i > 0 {
		return target{}, badSpec(spec, "unknown scheme %q", spec[:i])
	}
	return target{}, badSpec(spec, "a local path must be absolute")
}

func parseFile(spec string) (target, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return target{}, badSpec(spec, "%v", err)
	}
	switch {
	case u.Host != "":
		return target{}, badSpec(spec, "host %q in a file URL; write file:///abs/path (three slashes)", u.Host)
	case u.RawQuery != "" || u.Fragment != "":
		return target{}, badSpec(spec, "a file URL takes no ?query or #fragment")
	case !strings.HasPrefix(u.Path, "/"):
		return target{}, badSpec(spec, "the path must be absolute, as in file:///abs/path")
	}
	return target{dir: filepath.Clean(u.Path)}, nil
}

func parseS3(spec string) (target, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return target{}, badSpec(spec, "%v", err)
	}
	if u.Opaque != "" || u.Host == "" {
		return target{}, badSpec(spec, "no bucket; write s3://bucket/prefix")
	}
	if u.User != nil {
		return target{}, badSpec(spec, "credentials do not go in the spec; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	if u.Fragment != "" {
		return target{}, badSpec(spec, "an s3 spec takes no #fragment")
	}
	cfg := s3store.Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	q := u.Query()
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	sort.Strings(names) // report the first bad parameter the same way each time
	for _, name := range names {
		vals := q[name]
		if len(vals) != 1 {
			return target{}, badSpec(spec, "parameter %s given %d times", name, len(vals))
		}
		v := vals[0]
		switch name {
		case "endpoint":
			cfg.Endpoint = v
		case "region":
			cfg.Region = v
		case "path_style":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return target{}, badSpec(spec, "path_style=%q: want true or false", v)
			}
			cfg.PathStyle = b
		case "part_size":
			n, err := parseSize(v)
			if err != nil {
				return target{}, badSpec(spec, "part_size=%q: %v", v, err)
			}
			cfg.PartSize = n
		case "concurrency":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return target{}, badSpec(spec, "concurrency=%q: want a positive integer", v)
			}
			cfg.Concurrency = n
		default:
			return target{}, badSpec(spec, "unknown parameter %q (known: endpoint, region, path_style, part_size, concurrency)", name)
		}
	}
	if err := cfg.Validate(); err != nil {
		return target{}, badSpec(spec, "%v", err)
	}
	return target{s3: &cfg}, nil
}

// parseSize parses a byte count: a plain integer or one with a binary unit
// (KiB, MiB, GiB). Decimal units (MB) are refused rather than guessed, since
// 5MB is below S3's 5 MiB minimum part size.
func parseSize(v string) (int64, error) {
	num, mult := v, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(v, u.suffix) {
			num, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("want a positive number of bytes, optionally with KiB, MiB or GiB, like 8MiB")
	}
	return n * mult, nil
}
