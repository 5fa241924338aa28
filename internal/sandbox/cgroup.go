package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// v1Controllers are the cgroup v1 controllers an instance is placed in, in
// the order they are created. memory comes first: it is the one whose
// counters Stats and ExitStatus read.
var v1Controllers = []string{"memory", "cpu", "pids"}

// mountInfo is the part of one /proc/self/mountinfo line this package needs.
type mountInfo struct {
	Root       string // root of the mount within its filesystem
	MountPoint string
	FSType     string
	SuperOpts  []string
}

// parseMountinfo parses proc(5) mountinfo lines.
func parseMountinfo(r io.Reader) ([]mountInfo, error) {
	var out []mountInfo
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			return nil, fmt.Errorf("parse mountinfo line %q: no separator", line)
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 6 || len(g) < 2 {
			return nil, fmt.Errorf("parse mountinfo line %q: too few fields", line)
		}
		mi := mountInfo{Root: unescapeMount(f[3]), MountPoint: unescapeMount(f[4]), FSType: g[0]}
		if len(g) >= 3 {
			mi.SuperOpts = strings.Split(g[2], ",")
		}
		out = append(out, mi)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the octal escaping (\040 for space) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupLayout says which cgroup version torpor uses on this host and where
// its hierarchies are mounted.
type cgroupLayout struct {
	Version int
	V1      map[string]mountInfo // controller -> mount (version 1)
	V2      mountInfo            // the unified mount (version 2)
}

// detectCgroups picks the cgroup version from the mount table. Version 1 wins
// when the v1 hierarchies hold the controllers torpor needs (that includes
// systemd's "hybrid" layout, whose cgroup2 mount has no controllers);
// otherwise a cgroup2 mount means version 2.
func detectCgroups(mounts []mountInfo) (cgroupLayout, error) {
	l := cgroupLayout{V1: map[string]mountInfo{}}
	var v2 []mountInfo
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup":
			for _, o := range m.SuperOpts {
				if slices.Contains(v1Controllers, o) {
					if _, dup := l.V1[o]; !dup {
						l.V1[o] = m
					}
				}
			}
		case "cgroup2":
			v2 = append(v2, m)
		}
	}
	if len(l.V1) > 0 {
		var missing []string
		for _, c := range v1Controllers {
			if _, ok := l.V1[c]; !ok {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return cgroupLayout{}, fmt.Errorf("cgroup v1 hierarchies lack the %s controller(s): mount them (or boot with cgroup v2 only): %w",
				strings.Join(missing, ", "), errdefs.ErrUnavailable)
		}
		l.Version = 1
		return l, nil
	}
	if len(v2) == 0 {
		return cgroupLayout{}, fmt.Errorf("no cgroup hierarchy is mounted (looked for cgroup and cgroup2 in mountinfo): %w", errdefs.ErrUnavailable)
	}
	l.V1 = nil
	l.Version = 2
	l.V2 = v2[0]
	for _, m := range v2 {
		if m.MountPoint == "/sys/fs/cgroup" {
			l.V2 = m
		}
	}
	return l, nil
}

// parseProcCgroup parses /proc/<pid>/cgroup into controller -> cgroup path.
// The v2 entry ("0::/path") is stored under the key "".
func parseProcCgroup(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	return out, nil
}

// cgroupDir maps the cgroup path name (relative to the hierarchy root, as in
// /proc/self/cgroup, or relative to own when it does not start with "/") to a
// directory under the mount m.
func cgroupDir(m mountInfo, own, name string) (string, error) {
	var cg string
	if path.IsAbs(name) {
		cg = path.Clean(name)
		if m.Root != "/" {
			// The mount shows a sub-tree only; an absolute name is taken
			// relative to what is visible.
			return filepath.Join(m.MountPoint, cg), nil
		}
	} else {
		cg = path.Join(own, name)
	}
	rel := cg
	if m.Root != "/" {
		if cg != m.Root && !strings.HasPrefix(cg, m.Root+"/") {
			return "", fmt.Errorf("cgroup %s is outside the hierarchy mounted at %s (mount root %s): set an absolute CgroupName: %w",
				cg, m.MountPoint, m.Root, errdefs.ErrUnavailable)
		}
		rel = strings.TrimPrefix(cg, m.Root)
	}
	return filepath.Join(m.MountPoint, rel), nil
}

// cgroupWrite is one file written to set up an instance cgroup.
type cgroupWrite struct {
	Controller string // v1 controller whose directory holds File; "" for v2
	File       string
	Value      string
}

// v1Writes lists the files that apply l to v1 instance cgroups. memsw says
// whether memory.memsw.* exists (swap accounting is on).
func v1Writes(l Limits, memsw bool) []cgroupWrite {
	var w []cgroupWrite
	if l.MemoryMB > 0 {
		b := strconv.FormatInt(int64(l.MemoryMB)<<20, 10)
		w = append(w, cgroupWrite{"memory", "memory.limit_in_bytes", b})
		if memsw {
			// Must follow limit_in_bytes: memsw may never be below it.
			w = append(w, cgroupWrite{"memory", "memory.memsw.limit_in_bytes", b})
		}
	}
	if l.CPUShares > 0 {
		w = append(w, cgroupWrite{"cpu", "cpu.shares", strconv.Itoa(l.CPUShares)})
	}
	if l.Pids > 0 {
		w = append(w, cgroupWrite{"pids", "pids.max", strconv.Itoa(l.Pids)})
	}
	return w
}

// v2Writes lists the files that apply l to a v2 instance cgroup. swap says
// whether memory.swap.max exists.
func v2Writes(l Limits, swap bool) []cgroupWrite {
	var w []cgroupWrite
	if l.MemoryMB > 0 {
		w = append(w, cgroupWrite{"", "memory.max", strconv.FormatInt(int64(l.MemoryMB)<<20, 10)})
		if swap {
			w = append(w, cgroupWrite{"", "memory.swap.max", "0"})
		}
	}
	if l.CPUShares > 0 {
		w = append(w, cgroupWrite{"", "cpu.weight", strconv.Itoa(sharesToWeight(l.CPUShares))})
	}
	if l.Pids > 0 {
		w = append(w, cgroupWrite{"", "pids.max", strconv.Itoa(l.Pids)})
	}
	return w
}

// sharesToWeight converts v1 cpu.shares [2, 262144] to v2 cpu.weight
// [1, 10000] so that the defaults match (1024 -> 100). It is the quadratic
// (in log space) mapping of opencontainers/cgroups (runc >= 1.3.2); the
// older linear one mapped 1024 to 39, which starved instances next to
// cgroups at the default weight.
func sharesToWeight(shares int) int {
	switch {
	case shares <= 0:
		return 0
	case shares <= 2:
		return 1
	case shares >= 262144:
		return 10000
	}
	l := math.Log2(float64(shares))
	exp := (l*l+125*l)/612.0 - 7.0/34.0
	return int(math.Ceil(math.Pow(10, exp)))
}

// parseKeyed returns key's value from a flat-keyed cgroup file
// ("key value" lines, e.g. memory.events or memory.oom_control).
func parseKeyed(data []byte, key string) (uint64, bool) {
	for _, line := range bytes.Split(data, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(" "))
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// missingControllers returns the entries of want absent from a
// space-separated controller list (cgroup.controllers, cgroup.subtree_control).
func missingControllers(list string, want []string) []string {
	have := strings.Fields(list)
	var miss []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			miss = append(miss, c)
		}
	}
	return miss
}

// writeCgroupFile writes value to an existing cgroup control file. It does
// not create or truncate, which cgroupfs does not need.
func writeCgroupFile(file, value string) error {
	fd, err := unix.Open(file, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", file, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return fmt.Errorf("write %q to %s: %w", value, file, err)
	}
	return nil
}

// readUintFile reads a cgroup file holding one number ("max" reads as MaxUint64).
func readUintFile(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", file, err)
	}
	return n, nil
}

// cgroupTree is the parent cgroup (one directory per v1 controller, or one
// v2 directory) under which instance cgroups are created.
type cgroupTree struct {
	version int
	// parents maps v1 controller -> parent dir; for v2 the only key is "".
	parents  map[string]string
	optional map[string]bool // optional files present (memsw, swap.max)

	// v2 only.
	v2Start      string   // where delegation starts: the worker's own cgroup (relative name) or the mount (absolute)
	v2Delegators []string // v2Start and the dirs below it down to the parent's parent, top first
	v2Own        string   // the worker's own cgroup dir, for a relative name
	v2Leaf       string   // where the worker moves itself when its own cgroup must delegate
	movedTo      string   // set by setup when it moved the worker to v2Leaf
}

// newCgroupTree computes the parent directories for name from the mount
// table and the worker's own cgroups. It does no I/O.
func newCgroupTree(l cgroupLayout, self map[string]string, name string) (*cgroupTree, error) {
	t := &cgroupTree{version: l.Version, parents: map[string]string{}, optional: map[string]bool{}}
	if l.Version == 1 {
		for _, c := range v1Controllers {
			own, ok := self[c]
			if !ok {
				own = "/"
			}
			dir, err := cgroupDir(l.V1[c], own, name)
			if err != nil {
				return nil, err
			}
			t.parents[c] = dir
		}
		return t, nil
	}
	own, ok := self[""]
	if !ok {
		own = "/"
	}
	dir, err := cgroupDir(l.V2, own, name)
	if err != nil {
		return nil, err
	}
	t.parents[""] = dir
	t.v2Start = filepath.Clean(l.V2.MountPoint)
	if !path.IsAbs(name) {
		if t.v2Own, err = cgroupDir(l.V2, own, "."); err != nil {
			return nil, err
		}
		t.v2Start = t.v2Own
		first, _, _ := strings.Cut(name, "/")
		t.v2Leaf = filepath.Join(t.v2Own, first+"-manager")
	}
	for d := filepath.Dir(dir); len(d) >= len(t.v2Start); d = filepath.Dir(d) {
		t.v2Delegators = append([]string{d}, t.v2Delegators...)
		if d == t.v2Start || d == "/" {
			break
		}
	}
	return t, nil
}

// v2Wanted are the controllers an instance needs on cgroup v2.
var v2Wanted = []string{"memory", "cpu", "pids"}

// setup creates the parent cgroups and, on v2, delegates the controllers
// down to them.
func (t *cgroupTree) setup() error {
	if t.version == 1 {
		for _, c := range v1Controllers {
			if err := os.MkdirAll(t.parents[c], 0o755); err != nil {
				return fmt.Errorf("create parent cgroup: %w", err)
			}
		}
		_, err := os.Stat(filepath.Join(t.parents["memory"], "memory.memsw.limit_in_bytes"))
		t.optional["memsw"] = err == nil
		return nil
	}
	b, err := os.ReadFile(filepath.Join(t.v2Start, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read cgroup v2 controllers: %w", err)
	}
	if miss := missingControllers(string(b), v2Wanted); len(miss) > 0 {
		return fmt.Errorf("cgroup v2 %s lacks the %s controller(s) (bound to a cgroup v1 hierarchy, or not delegated to the worker): %w",
			t.v2Start, strings.Join(miss, ", "), errdefs.ErrUnavailable)
	}
	parent := t.parents[""]
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("create parent cgroup: %w", err)
	}
	for _, d := range append(slices.Clone(t.v2Delegators), parent) {
		err := enableControllers(d, v2Wanted)
		if errors.Is(err, unix.EBUSY) && d == t.v2Own {
			// "No internal processes": the worker's own cgroup can only
			// delegate once the worker has moved to a leaf of its own, as
			// systemd expects of a service with Delegate=yes.
			if merr := t.moveSelfToLeaf(); merr != nil {
				return fmt.Errorf("%w; %w", err, merr)
			}
			err = enableControllers(d, v2Wanted)
		}
		if err != nil {
			return err
		}
	}
	_, err = os.Stat(filepath.Join(parent, "memory.swap.max"))
	t.optional["swap"] = err == nil
	return nil
}

// moveSelfToLeaf moves the worker process from its own cgroup to v2Leaf,
// provided it is alone there (others are not this package's to move).
func (t *cgroupTree) moveSelfToLeaf() error {
	b, err := os.ReadFile(filepath.Join(t.v2Own, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("list processes of the worker's cgroup: %w", err)
	}
	var others []string
	for _, f := range strings.Fields(string(b)) {
		if f != strconv.Itoa(os.Getpid()) {
			others = append(others, f)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("cannot move the worker out of the way: processes %s share its cgroup %s; run the worker in a cgroup of its own (systemd: Delegate=yes) or set an absolute CgroupName: %w",
			strings.Join(others, " "), t.v2Own, errdefs.ErrUnavailable)
	}
	if err := os.Mkdir(t.v2Leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the worker's leaf cgroup: %w", err)
	}
	if err := writeCgroupFile(filepath.Join(t.v2Leaf, "cgroup.procs"), "0"); err != nil {
		return fmt.Errorf("move the worker to its leaf cgroup: %w", err)
	}
	t.movedTo = t.v2Leaf
	return nil
}

// enableControllers writes "+c" to dir's cgroup.subtree_control for every
// controller in want not already enabled there.
func enableControllers(dir string, want []string) error {
	file := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read %s: %w", file, err)
	}
	miss := missingControllers(string(b), want)
	if len(miss) == 0 {
		return nil
	}
	if err := writeCgroupFile(file, "+"+strings.Join(miss, " +")); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("enable cgroup v2 controllers in %s: it holds processes, so it cannot delegate: %w", dir, err)
		}
		return fmt.Errorf("enable cgroup v2 controllers: %w", err)
	}
	return nil
}

// instance returns the (possibly not yet existing) cgroup of instance id.
func (t *cgroupTree) instance(id string) *instanceCgroup {
	c := &instanceCgroup{version: t.version}
	if t.version == 1 {
		for _, ctl := range v1Controllers {
			c.dirs = append(c.dirs, filepath.Join(t.parents[ctl], id))
		}
	} else {
		c.dirs = []string{filepath.Join(t.parents[""], id)}
	}
	return c
}

// create makes the cgroup of instance id and applies l. On error nothing is
// left behind.
func (t *cgroupTree) create(id string, l Limits) (*instanceCgroup, error) {
	c := t.instance(id)
	var writes []cgroupWrite
	if t.version == 1 {
		writes = v1Writes(l, t.optional["memsw"])
	} else {
		writes = v2Writes(l, t.optional["swap"])
	}
	for i, d := range c.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			c.rmdirs(c.dirs[:i])
			if errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("create cgroup %s: already exists: %w", d, errdefs.ErrConflict)
			}
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
	}
	for _, w := range writes {
		if err := writeCgroupFile(filepath.Join(c.dir(w.Controller), w.File), w.Value); err != nil {
			c.rmdirs(c.dirs)
			return nil, fmt.Errorf("set cgroup limit: %w", err)
		}
	}
	return c, nil
}

// children lists the names of the sub-cgroups of the parent(s).
func (t *cgroupTree) children() ([]string, error) {
	var names []string
	for _, dir := range t.parents {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("list cgroups: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(names, e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// removeParents removes the parent cgroups; it fails if instances remain.
// With alsoParent it then tries to remove each parent's own parent too,
// which succeeds only once no other worker uses it.
func (t *cgroupTree) removeParents(alsoParent bool) error {
	var errs []error
	for _, dir := range t.parents {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			continue
		}
		if alsoParent {
			_ = unix.Rmdir(filepath.Dir(dir))
		}
	}
	return errors.Join(errs...)
}

// instanceCgroup is the cgroup of one instance: a directory per v1
// controller (memory first) or one v2 directory.
type instanceCgroup struct {
	version int
	dirs    []string
}

// dir returns the directory holding a controller's files.
func (c *instanceCgroup) dir(controller string) string {
	if c.version == 2 {
		return c.dirs[0]
	}
	return c.dirs[slices.Index(v1Controllers, controller)]
}

// procsFiles lists the cgroup.procs files the init writes "0" to.
func (c *instanceCgroup) procsFiles() []string {
	out := make([]string, len(c.dirs))
	for i, d := range c.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// oomKills returns how many processes the kernel OOM killer killed in the cgroup.
func (c *instanceCgroup) oomKills() (uint64, error) {
	file := filepath.Join(c.dir("memory"), "memory.oom_control")
	if c.version == 2 {
		file = filepath.Join(c.dir("memory"), "memory.events")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read oom counter: %w", err)
	}
	n, ok := parseKeyed(b, "oom_kill")
	if !ok {
		return 0, fmt.Errorf("read oom counter: no oom_kill in %s", file)
	}
	return n, nil
}

// setParentMemory limits the parent cgroup's memory to mb (0: no limit set).
func (t *cgroupTree) setParentMemory(mb int) error {
	if mb <= 0 {
		return nil
	}
	b := strconv.FormatInt(int64(mb)<<20, 10)
	var writes []string
	if t.version == 1 {
		writes = append(writes, filepath.Join(t.parents["memory"], "memory.limit_in_bytes"))
		if t.optional["memsw"] {
			writes = append(writes, filepath.Join(t.parents["memory"], "memory.memsw.limit_in_bytes"))
		}
	} else {
		writes = append(writes, filepath.Join(t.parents[""], "memory.max"))
	}
	for _, f := range writes {
		if err := writeCgroupFile(f, b); err != nil {
			return fmt.Errorf("limit the sandboxes' memory to %d MB: %w", mb, err)
		}
	}
	return nil
}

// parentHeadroom is the parent cgroup's memory limit minus its usage; ok is
// false when it has no limit of its own.
func (t *cgroupTree) parentHeadroom() (int64, bool, error) {
	dir, lim, cur := t.parents["memory"], "memory.limit_in_bytes", "memory.usage_in_bytes"
	if t.version == 2 {
		dir, lim, cur = t.parents[""], "memory.max", "memory.current"
	}
	lb, err := os.ReadFile(filepath.Join(dir, lim))
	if err != nil {
		return 0, false, fmt.Errorf("read sandboxes' memory limit: %w", err)
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(string(lb)), 10, 64)
	if err != nil || limit >= 1<<60 { // "max", or v1's "unlimited" page-rounded LONG_MAX
		return 0, false, nil
	}
	usage, err := readUintFile(filepath.Join(dir, cur))
	if err != nil {
		return 0, false, fmt.Errorf("read sandboxes' memory usage: %w", err)
	}
	return limit - int64(usage), true, nil
}

// stats reads the memory counters.
func (c *instanceCgroup) stats() (Stats, error) {
	cur, peak := "memory.usage_in_bytes", "memory.max_usage_in_bytes"
	if c.version == 2 {
		cur, peak = "memory.current", "memory.peak"
	}
	var s Stats
	var err error
	if s.MemoryBytes, err = readUintFile(filepath.Join(c.dir("memory"), cur)); err != nil {
		return Stats{}, fmt.Errorf("read memory usage: %w", err)
	}
	if s.MaxMemoryBytes, err = readUintFile(filepath.Join(c.dir("memory"), peak)); err != nil {
		if c.version == 2 && errors.Is(err, os.ErrNotExist) {
			return s, nil // memory.peak is new in Linux 5.19
		}
		return Stats{}, fmt.Errorf("read peak memory usage: %w", err)
	}
	return s, nil
}

// killAll SIGKILLs every process in the cgroup (cgroup.kill on v2 when the
// kernel has it).
func (c *instanceCgroup) killAll() error {
	return killProcs(c.version, c.dirs)
}

// killProcs SIGKILLs every process in the cgroup directories dirs.
func killProcs(version int, dirs []string) error {
	if version == 2 && len(dirs) == 1 {
		if err := writeCgroupFile(filepath.Join(dirs[0], "cgroup.kill"), "1"); err == nil {
			return nil // Linux >= 5.14
		}
	}
	var errs []error
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("list processes: %w", err))
			}
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				continue
			}
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("kill pid %d: %w", pid, err))
			}
		}
	}
	return errors.Join(errs...)
}

// rmdirs removes dirs once, ignoring errors; for undoing a half-made create.
func (c *instanceCgroup) rmdirs(dirs []string) {
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}

// remove removes the cgroup directories. Right after the last process exits
// the kernel may still count it (EBUSY), so it retries, killing anything
// left, until ctx is done. The happy path is one rmdir per directory.
func (c *instanceCgroup) remove(ctx context.Context) error {
	dirs := c.dirs
	backoff := time.Millisecond
	for {
		var busy []string
		for _, d := range dirs {
			err := unix.Rmdir(d)
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
			case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTEMPTY):
				busy = append(busy, d)
			default:
				return fmt.Errorf("remove cgroup %s: %w", d, err)
			}
		}
		if len(busy) == 0 {
			return nil
		}
		dirs = busy
		_ = killProcs(c.version, dirs)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("remove cgroup %s: still busy: %w (%w)", busy[0], errdefs.ErrTimeout, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}
