package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/sandbox"
)

// baselineDescription says what the baseline runs, for the report.
const baselineDescription = "checkpoint: criu dump --images-dir DIR (files on disk, no --stream; the engine's other options); " +
	"tar -C DIR -cf - . | zstd -q -1 -T0 -o FILE; blob.Store.Put(FILE). " +
	"restore: blob.Store.Get -> FILE on disk; zstd -q -d -c FILE | tar -C DIR -xf -; " +
	"criu restore --images-dir DIR in the sandbox's cgroups (as the engine). No signing, hashing or verification."

// baseline checkpoints a fresh instance the unpipelined way, each step
// finishing before the next starts, through files on disk, and restores
// it the same way.
func (b *snapshotBench) baseline(ctx context.Context, run *SnapshotRun) error {
	store := b.stores[run.Store]
	src, err := b.startInstance(ctx, run.SizeMB, run.Data)
	if err != nil {
		return err
	}
	defer b.destroy(src.sb)
	dir, err := os.MkdirTemp(b.baseDir, "run-")
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	defer os.RemoveAll(dir)
	imgs, logs, file := filepath.Join(dir, "images"), filepath.Join(dir, "logs"), filepath.Join(dir, "image.tar.zst")
	for _, d := range []string{imgs, logs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
	}
	key := "bench/baseline/" + strconv.FormatInt(time.Now().UnixNano(), 36)

	probe := startProbe()
	t := time.Now()
	err = b.baselineCheckpoint(ctx, run, src, imgs, logs, file, key)
	run.CheckpointMS = millisSince(t)
	run.CheckpointRSSBytes, run.CheckpointWriteBytes = probe.stop()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := store.Delete(dctx, key); err != nil {
			b.log.Warn("delete baseline image", "key", key, "err", err)
		}
	}()
	if err != nil {
		return fmt.Errorf("baseline checkpoint: %w", err)
	}
	b.destroy(src.sb) // CRIU killed it
	// A restore starts from the store, as on another node.
	if err := os.RemoveAll(imgs); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if err := os.Remove(file); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}

	probe = startProbe()
	t = time.Now()
	dst, err := b.baselineRestore(ctx, run, imgs, logs, file, key)
	run.RestoreMS = millisSince(t)
	run.RestoreRSSBytes, run.RestoreWriteBytes = probe.stop()
	if err != nil {
		return fmt.Errorf("baseline restore: %w", err)
	}
	defer b.destroy(dst)
	run.RestoredRSSBytes, err = verifyRestored(dst, run.SizeMB)
	return err
}

func (b *snapshotBench) baselineCheckpoint(ctx context.Context, run *SnapshotRun, src *instance, imgs, logs, file, key string) error {
	args := []string{"dump", "--tree", strconv.Itoa(src.sb.Pid()), "--images-dir", imgs, "--work-dir", logs, "--log-file", "dump.log"}
	for _, m := range b.sbm.ExternalMounts(src.spec) {
		args = append(args, "--external", "mnt["+m.Target+"]:"+m.Key)
	}
	t := time.Now()
	// Through the same prefix as the engine's dumps (its /run holds
	// CRIU's kernel-feature cache), so that only the data flow differs.
	if err := b.engine.Run(ctx, b.sbm.ExecPrefix(), filepath.Join(logs, "dump.log"), args...); err != nil {
		return err
	}
	run.DumpMS = millisSince(t)
	raw, err := dirBytes(imgs)
	if err != nil {
		return err
	}
	run.RawBytes = raw

	t = time.Now()
	err = runPipe(ctx, []string{"tar", "-C", imgs, "-cf", "-", "."}, []string{"zstd", "-q", "-1", "-T0", "-o", file})
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	run.CompressMS = millisSince(t)

	t = time.Now()
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	run.StoredBytes = fi.Size()
	if _, err := b.stores[run.Store].Put(ctx, key, f, fi.Size()); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	run.UploadMS = millisSince(t)
	return nil
}

func (b *snapshotBench) baselineRestore(ctx context.Context, run *SnapshotRun, imgs, logs, file, key string) (*sandbox.Sandbox, error) {
	t := time.Now()
	if err := download(ctx, b.stores[run.Store], key, file); err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	run.DownloadMS = millisSince(t)

	t = time.Now()
	if err := os.Mkdir(imgs, 0o700); err != nil {
		return nil, err
	}
	if err := runPipe(ctx, []string{"zstd", "-q", "-d", "-c", file}, []string{"tar", "-C", imgs, "-xf", "-"}); err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	run.DecompressMS = millisSince(t)

	spec := b.nextSpec(run.SizeMB, run.Data)
	return b.sbm.Restore(ctx, spec, func(ctx context.Context, env sandbox.RestoreEnv) (int, error) {
		pidFile := filepath.Join(logs, "restore.pid")
		args := []string{"restore", "--images-dir", imgs, "--work-dir", logs, "--log-file", "restore.log",
			"--root", env.Root, "--pidfile", pidFile, "--restore-detached", "--restore-sibling"}
		for _, m := range env.Mounts {
			args = append(args, "--external", "mnt["+m.Key+"]:"+m.Source)
		}
		t := time.Now()
		if err := b.engine.Run(ctx, env.ExecPrefix, filepath.Join(logs, "restore.log"), args...); err != nil {
			return 0, err
		}
		run.CRIURestoreMS = millisSince(t)
		pb, err := os.ReadFile(pidFile)
		if err != nil {
			return 0, fmt.Errorf("criu restore wrote no pid file: %w", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
		if err != nil || pid <= 0 {
			return 0, fmt.Errorf("criu restore: bad pid file %q", pb)
		}
		return pid, nil
	})
}

// download copies object key of store into file.
func download(ctx context.Context, store blob.Store, key, file string) error {
	rc, _, err := store.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// dirBytes is the total size of the regular files in dir.
func dirBytes(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return 0, err
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n, nil
}

// runPipe runs a | b and fails if either fails, with its stderr.
func runPipe(ctx context.Context, a, b []string) error {
	ca := exec.CommandContext(ctx, a[0], a[1:]...)
	cb := exec.CommandContext(ctx, b[0], b[1:]...)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	ea, eb := &tailBuffer{max: 2 << 10}, &tailBuffer{max: 2 << 10}
	ca.Stdout, ca.Stderr = w, ea
	cb.Stdin, cb.Stderr = r, eb
	setPdeathsig(ca)
	setPdeathsig(cb)
	if err := ca.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("%s: %w", a[0], err)
	}
	err = cb.Start()
	// The children hold the pipe now; keeping our ends open would keep b
	// from seeing the end of a's output.
	r.Close()
	w.Close()
	if err != nil {
		_ = ca.Process.Kill()
		_ = ca.Wait()
		return fmt.Errorf("%s: %w", b[0], err)
	}
	erra, errb := ca.Wait(), cb.Wait()
	if erra != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(a, " "), erra, ea)
	}
	if errb != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(b, " "), errb, eb)
	}
	return nil
}
