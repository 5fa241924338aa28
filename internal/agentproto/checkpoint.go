package agentproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// CheckpointReady is the agent's answer to PrepareCheckpoint.
type CheckpointReady struct {
	RSSBefore int64         // resident bytes before the runtime's GC
	RSSAfter  int64         // resident bytes after the GC and allocator trim
	GC        time.Duration // time the GC and trim took
}

// Resumed is the agent's answer to AfterRestore.
type Resumed struct {
	ClockJump time.Duration // wall time between checkpoint-ready and after-restore
	Pid       int           // the agent's pid in its own PID namespace
	// InCall is the call that was running at the checkpoint and runs on
	// now: collect its outcome with Await. Empty for an idle instance.
	InCall string
}

// PrepareCheckpoint makes the instance ready to be dumped: the agent runs
// its runtime's GC and trims the allocator (when gc is set), starts
// listening on the Unix socket listen (a path inside the instance), replies,
// and closes its end of this connection, because a socket of the worker's
// network namespace cannot be part of a snapshot. PrepareCheckpoint returns
// once that end is closed; from then on the instance talks only through a
// new connection to listen (see AfterRestore), and this Client is closed.
func (c *Client) PrepareCheckpoint(ctx context.Context, listen string, gc bool, onLog func(LogRecord)) (CheckpointReady, error) {
	id := "ckpt-" + strconv.FormatUint(c.seq.Add(1), 10)
	const op = "prepare-checkpoint"
	if err := c.lock(ctx, op, id); err != nil {
		return CheckpointReady{}, err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, op, id, &Header{Type: TypePrepareCheckpoint, ID: id, Listen: listen, GC: &gc}, nil, onLog)
	if err != nil {
		return CheckpointReady{}, err
	}
	switch {
	case h.Type == TypeError && h.Error != nil && h.ID == id:
		// The agent refused (e.g. an older agent): it keeps serving here.
		return CheckpointReady{}, fmt.Errorf("%s: %s: %s", opName(op, id), h.Error.ErrorType, h.Error.ErrorMessage)
	case h.Type != TypeCheckpointReady || h.ID != id:
		return CheckpointReady{}, c.violation(op, id, "agent answered %s with %q for %q", op, h.Type, h.ID)
	}
	ready := CheckpointReady{RSSBefore: h.RSSBefore, RSSAfter: h.RSSAfter, GC: time.Duration(h.GCMS * float64(time.Millisecond))}
	return ready, c.awaitHandOver(ctx, op, id, onLog)
}

// awaitHandOver waits for the agent to let go of its end of the socket
// after checkpoint-ready (until it has, a dump would meet a socket it
// cannot capture), then closes this Client.
func (c *Client) awaitHandOver(ctx context.Context, op, id string, onLog func(LogRecord)) error {
	for {
		body, err := readFrame(c.br, &c.in, &c.scratch)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c.fail(ctx, op, id, err)
		}
		if c.in.Type != TypeLog {
			return c.violation(op, id, "agent sent %q after checkpoint-ready; want the socket closed", c.in.Type)
		}
		if onLog != nil {
			onLog(LogRecord{CallID: c.in.ID, Stream: c.in.Stream, Data: body})
		}
	}
	c.broken = fmt.Errorf("%s: the agent moved to a new socket after a checkpoint: %w", opName(op, id), ErrUnusable)
	_ = c.Close()
	return nil
}

// AfterRestore is the first exchange on a connection to the socket an
// agent listens on after PrepareCheckpoint: restored says whether this
// process came from a snapshot (the agent then reseeds its RNGs) or is the
// original, left running after a dump.
func (c *Client) AfterRestore(ctx context.Context, restored bool) (Resumed, error) {
	id := "resume-" + strconv.FormatUint(c.seq.Add(1), 10)
	const op = "after-restore"
	if err := c.lock(ctx, op, id); err != nil {
		return Resumed{}, err
	}
	defer c.unlock()
	h, _, err := c.exchange(ctx, op, id, &Header{Type: TypeAfterRestore, ID: id, Restored: restored}, nil, nil)
	if err != nil {
		return Resumed{}, err
	}
	if h.Type != TypeResumed || h.ID != id {
		return Resumed{}, c.violation(op, id, "agent answered %s with %q for %q", op, h.Type, h.ID)
	}
	return Resumed{ClockJump: time.Duration(h.ClockJumpMS * float64(time.Millisecond)), Pid: h.Pid, InCall: h.InCall}, nil
}
