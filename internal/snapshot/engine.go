// Package snapshot owns process snapshots of function instances: the
// Engine interface that checkpoints and restores a process tree (CRIU is
// the implementation, in package criu), and the Checkpointer that streams
// an engine's image files through package image into a blob store and back.
//
// It knows nothing of workers, calls or HTTP; the worker decides when to
// snapshot and what to do with a restored instance. It must not import the
// worker or the sandbox package: sandbox-specific facts (mounts, cgroups)
// reach it as plain values in CheckpointSpec and RestoreSpec.
package snapshot

import (
	"context"
	"io"
	"time"
)

// Engine checkpoints and restores whole process trees.
type Engine interface {
	// Checkpoint dumps the process tree rooted at spec.Pid, handing each
	// image file to sink as it is produced (no image is written to disk).
	// The tree is left running or killed as spec says. Cancelling ctx stops
	// the dump; a tree left running keeps running.
	Checkpoint(ctx context.Context, spec CheckpointSpec, sink ImageSink) (CheckpointStats, error)
	// Restore recreates the process tree whose image files are in
	// spec.ImagesDir and returns the host pid of its root, which is a
	// child of the calling process. On error nothing of the tree is left.
	Restore(ctx context.Context, spec RestoreSpec) (RestoreStats, error)
	// Info names the engine and checks that it can work on this host.
	Info(ctx context.Context) (EngineInfo, error)
}

// ImageSink receives the image files of a checkpoint as they are written.
// Open may be called concurrently with writes to files opened earlier;
// each returned writer is closed when its file is complete.
type ImageSink interface {
	Open(name string) (io.WriteCloser, error)
}

// Mount is a bind mount of a host directory into the instance: a
// checkpoint records it by Key only (the host path is the worker's
// business), and a restore binds Key to whatever path the restoring
// worker has for it.
type Mount struct {
	Key    string // stable name, e.g. "usr", "var-task"
	Target string // path inside the instance
	Source string // host path (restore only)
}

// CheckpointSpec says what to dump.
type CheckpointSpec struct {
	Pid          int     // host pid of the tree's root (the instance's pid 1)
	LeaveRunning bool    // keep the tree running after the dump; otherwise it is killed
	Mounts       []Mount // external bind mounts (Target and Key)
	WorkDir      string  // scratch directory for the engine's socket and log
	// ExecPrefix, when set, runs the engine through another program (see
	// RestoreSpec.ExecPrefix).
	ExecPrefix []string
}

// RestoreSpec says what to restore and where.
type RestoreSpec struct {
	ImagesDir string  // the verified image files
	Root      string  // an empty directory to build the root mount on
	Mounts    []Mount // external bind mounts (Key and Source)
	WorkDir   string  // scratch directory for the engine's log and pid file
	// EmptyNetwork restores the tree's network namespace without its
	// addresses, routes and rules (loopback stays down; the sandbox brings
	// it up). Only for trees without inet sockets (LabelNoInetSockets):
	// restoring a namespace's contents runs ip(8) five times, ~20 ms.
	EmptyNetwork bool
	// ExecPrefix, when set, runs the engine through another program:
	// ExecPrefix[0] is that program's path, ExecPrefix[1:] its argv
	// (argv[0] first), and the engine's command line is appended. The
	// sandbox uses it to start the engine inside the new instance's
	// cgroups, so that every restored process is born there.
	ExecPrefix []string
}

// LabelNoInetSockets, set to "true" in a snapshot's labels, says the tree
// held no inet sockets when it was dumped, so that its network namespace
// can be restored empty (RestoreSpec.EmptyNetwork).
const LabelNoInetSockets = "torpor.no-inet-sockets"

// CheckpointStats measures one checkpoint.
type CheckpointStats struct {
	Duration time.Duration // the whole dump, as the engine ran it
	Bytes    int64         // image bytes produced
}

// RestoreStats measures one restore.
type RestoreStats struct {
	Pid      int           // host pid of the restored tree's root
	Duration time.Duration // the whole restore
}

// EngineInfo describes an engine on this host.
type EngineInfo struct {
	Name    string // "criu"
	Version string // e.g. "4.2.1"
	Path    string // how it is run
	Source  string // where it came from, e.g. "private prefix /usr/local/lib/torpor-criu"
	Check   error  // nil when the engine's own host check passed
}
