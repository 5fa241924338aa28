package bus

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Follow mirrors a KV bucket into memory: it hands every entry w delivers
// to apply — initial says whether it is one of the values the bucket held
// when the watch began — from a goroutine that runs until ctx ends or w
// closes, and stops w then. It returns once the initial values have been
// applied, or with ctx's error.
func Follow(ctx context.Context, w jetstream.KeyWatcher, apply func(e jetstream.KeyValueEntry, initial bool)) error {
	ready := make(chan struct{})
	go func() {
		defer func() { _ = w.Stop() }()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					initial = false
					close(ready)
					continue
				}
				apply(e, initial)
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
