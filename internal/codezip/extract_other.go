//go:build !unix

package codezip

import (
	"context"
	"errors"
)

// Extract unpacks zipBytes into dir. It needs the *at system calls with
// O_NOFOLLOW to write safely, so it is available on unix systems only;
// workers run on Linux.
func Extract(ctx context.Context, zipBytes []byte, dir string) error {
	return errors.New("extract code: only supported on unix systems, where torpor workers run")
}
