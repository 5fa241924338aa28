package sandbox

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Mount tables as seen on real hosts.
const (
	// Debian 12 VM with cgroup v1 and an empty cgroup2 (this CI machine).
	mountinfoV1 = `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	// systemd "hybrid" (Ubuntu 20.04): v1 controllers, cgroup2 for systemd only.
	mountinfoHybrid = `34 25 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
35 34 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 34 0:31 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
40 34 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,cpu,cpuacct
41 34 0:36 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,memory
42 34 0:37 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:19 - cgroup cgroup rw,pids
`
	// Unified cgroup v2 (Debian 12, Ubuntu 22.04+, Fedora).
	mountinfoV2 = `25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	// A v1 container whose cgroup mounts show only its own sub-tree.
	mountinfoV1Container = `1520 1519 0:31 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
1521 1519 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
1522 1519 0:33 /docker/abc /sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids
`
	mountinfoV1NoPids = `35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
`
	mountinfoNone = `27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
`
)

func TestDetectCgroups(t *testing.T) {
	tests := []struct {
		name      string
		mountinfo string
		version   int
		mounts    map[string]string // controller ("" for v2) -> mount point
		errClass  error
		errText   string
	}{
		{"v1", mountinfoV1, 1, map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu", "pids": "/sys/fs/cgroup/pids"}, nil, ""},
		{"hybrid", mountinfoHybrid, 1, map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}, nil, ""},
		{"v2", mountinfoV2, 2, map[string]string{"": "/sys/fs/cgroup"}, nil, ""},
		{"v1 in a container", mountinfoV1Container, 1, map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}, nil, ""},
		{"v1 without pids", mountinfoV1NoPids, 0, nil, errdefs.ErrUnavailable, "lack the pids controller"},
		{"no cgroups", mountinfoNone, 0, nil, errdefs.ErrUnavailable, "no cgroup hierarchy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mounts, err := parseMountinfo(strings.NewReader(tt.mountinfo))
			if err != nil {
				t.Fatal(err)
			}
			l, err := detectCgroups(mounts)
			if tt.errClass != nil {
				if !errors.Is(err, tt.errClass) || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("error %v, want %v containing %q", err, tt.errClass, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.Version != tt.version {
				t.Errorf("version %d, want %d", l.Version, tt.version)
			}
			got := map[string]string{}
			if l.Version == 1 {
				for c, m := range l.V1 {
					got[c] = m.MountPoint
				}
			} else {
				got[""] = l.V2.MountPoint
			}
			if !maps.Equal(got, tt.mounts) {
				t.Errorf("mounts %v, want %v", got, tt.mounts)
			}
		})
	}
}

func TestParseMountinfoEscapes(t *testing.T) {
	mounts, err := parseMountinfo(strings.NewReader(`50 27 0:40 / /mnt/with\040space rw - tmpfs tmpfs rw,size=1024k` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].MountPoint != "/mnt/with space" || mounts[0].FSType != "tmpfs" || !slices.Equal(mounts[0].SuperOpts, []string{"rw", "size=1024k"}) {
		t.Errorf("parsed %+v", mounts)
	}
	if _, err := parseMountinfo(strings.NewReader("garbage line\n")); err == nil {
		t.Error("no error for a line without separator")
	}
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string
	}{
		{"v1", "9:name=systemd:/\n4:memory:/process_api/e44c\n1:cpu,cpuacct:/a\n0::/\n", map[string]string{"name=systemd": "/", "memory": "/process_api/e44c", "cpu": "/a", "cpuacct": "/a", "": "/"}},
		{"v2", "0::/system.slice/torpor.service\n", map[string]string{"": "/system.slice/torpor.service"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProcCgroup(strings.NewReader(tt.in))
			if err != nil || !maps.Equal(got, tt.want) {
				t.Errorf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestNewCgroupTree(t *testing.T) {
	layout := func(mi string) cgroupLayout {
		mounts, err := parseMountinfo(strings.NewReader(mi))
		if err != nil {
			t.Fatal(err)
		}
		l, err := detectCgroups(mounts)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	tests := []struct {
		name       string
		layout     cgroupLayout
		self       map[string]string
		cgName     string
		parents    map[string]string
		delegators []string
		leaf       string
		errText    string
	}{
		{
			name:   "v1 at the root",
			layout: layout(mountinfoV1), self: map[string]string{"memory": "/", "cpu": "/", "pids": "/"}, cgName: "torpor",
			parents: map[string]string{"memory": "/sys/fs/cgroup/memory/torpor", "cpu": "/sys/fs/cgroup/cpu/torpor", "pids": "/sys/fs/cgroup/pids/torpor"},
		},
		{
			name:   "v1 nested under the worker's cgroups",
			layout: layout(mountinfoV1), self: map[string]string{"memory": "/process_api/e44c", "cpu": "/", "pids": "/svc"}, cgName: "torpor",
			parents: map[string]string{"memory": "/sys/fs/cgroup/memory/process_api/e44c/torpor", "cpu": "/sys/fs/cgroup/cpu/torpor", "pids": "/sys/fs/cgroup/pids/svc/torpor"},
		},
		{
			name:   "v1 absolute name",
			layout: layout(mountinfoV1), self: map[string]string{"memory": "/process_api/e44c"}, cgName: "/torpor",
			parents: map[string]string{"memory": "/sys/fs/cgroup/memory/torpor", "cpu": "/sys/fs/cgroup/cpu/torpor", "pids": "/sys/fs/cgroup/pids/torpor"},
		},
		{
			name:   "v1 container mount root",
			layout: layout(mountinfoV1Container), self: map[string]string{"memory": "/docker/abc", "cpu": "/docker/abc", "pids": "/docker/abc/x"}, cgName: "torpor",
			parents: map[string]string{"memory": "/sys/fs/cgroup/memory/torpor", "cpu": "/sys/fs/cgroup/cpu,cpuacct/torpor", "pids": "/sys/fs/cgroup/pids/x/torpor"},
		},
		{
			name:   "v1 own cgroup outside the mount",
			layout: layout(mountinfoV1Container), self: map[string]string{"memory": "/other"}, cgName: "torpor",
			errText: "outside the hierarchy",
		},
		{
			name:   "v2 service",
			layout: layout(mountinfoV2), self: map[string]string{"": "/system.slice/torpor.service"}, cgName: "torpor",
			parents:    map[string]string{"": "/sys/fs/cgroup/system.slice/torpor.service/torpor"},
			delegators: []string{"/sys/fs/cgroup/system.slice/torpor.service"},
			leaf:       "/sys/fs/cgroup/system.slice/torpor.service/torpor-manager",
		},
		{
			name:   "v2 nested name",
			layout: layout(mountinfoV2), self: map[string]string{"": "/w"}, cgName: "a/b",
			parents:    map[string]string{"": "/sys/fs/cgroup/w/a/b"},
			delegators: []string{"/sys/fs/cgroup/w", "/sys/fs/cgroup/w/a"},
			leaf:       "/sys/fs/cgroup/w/a-manager",
		},
		{
			name:   "v2 absolute name",
			layout: layout(mountinfoV2), self: map[string]string{"": "/user.slice/session-1.scope"}, cgName: "/torpor",
			parents:    map[string]string{"": "/sys/fs/cgroup/torpor"},
			delegators: []string{"/sys/fs/cgroup"},
		},
		{
			name:   "v2 at the root",
			layout: layout(mountinfoV2), self: map[string]string{"": "/"}, cgName: "torpor",
			parents:    map[string]string{"": "/sys/fs/cgroup/torpor"},
			delegators: []string{"/sys/fs/cgroup"},
			leaf:       "/sys/fs/cgroup/torpor-manager",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tree, err := newCgroupTree(tt.layout, tt.self, tt.cgName)
			if tt.errText != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("error %v, want one containing %q", err, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(tree.parents, tt.parents) {
				t.Errorf("parents %v, want %v", tree.parents, tt.parents)
			}
			if !slices.Equal(tree.v2Delegators, tt.delegators) || tree.v2Leaf != tt.leaf {
				t.Errorf("delegators %q leaf %q, want %q %q", tree.v2Delegators, tree.v2Leaf, tt.delegators, tt.leaf)
			}
			inst := tree.instance("fn-1")
			if tree.version == 1 {
				if want := filepath.Join(tt.parents["memory"], "fn-1"); inst.dir("memory") != want {
					t.Errorf("instance memory dir %s, want %s", inst.dir("memory"), want)
				}
			} else if want := filepath.Join(tt.parents[""], "fn-1", "cgroup.procs"); !slices.Equal(inst.procsFiles(), []string{want}) {
				t.Errorf("instance procs files %v, want [%s]", inst.procsFiles(), want)
			}
		})
	}
}

func TestCgroupWrites(t *testing.T) {
	tests := []struct {
		name     string
		limits   Limits
		optional bool
		v1, v2   []cgroupWrite
	}{
		{
			name:   "all limits",
			limits: Limits{MemoryMB: 128, CPUShares: 1024, Pids: 64}, optional: true,
			v1: []cgroupWrite{
				{"memory", "memory.limit_in_bytes", "134217728"},
				{"memory", "memory.memsw.limit_in_bytes", "134217728"},
				{"cpu", "cpu.shares", "1024"},
				{"pids", "pids.max", "64"},
			},
			v2: []cgroupWrite{
				{"", "memory.max", "134217728"},
				{"", "memory.swap.max", "0"},
				{"", "cpu.weight", "100"},
				{"", "pids.max", "64"},
			},
		},
		{
			name:   "no swap accounting",
			limits: Limits{MemoryMB: 16}, optional: false,
			v1: []cgroupWrite{{"memory", "memory.limit_in_bytes", "16777216"}},
			v2: []cgroupWrite{{"", "memory.max", "16777216"}},
		},
		{name: "no limits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := v1Writes(tt.limits, tt.optional); !slices.Equal(got, tt.v1) {
				t.Errorf("v1 %v, want %v", got, tt.v1)
			}
			if got := v2Writes(tt.limits, tt.optional); !slices.Equal(got, tt.v2) {
				t.Errorf("v2 %v, want %v", got, tt.v2)
			}
		})
	}
}

func TestSharesToWeight(t *testing.T) {
	tests := []struct{ shares, weight int }{
		{0, 0}, {1, 1}, {2, 1}, {128, 21}, {512, 59}, {1024, 100}, {2048, 174}, {262144, 10000}, {1 << 20, 10000},
	}
	for _, tt := range tests {
		if got := sharesToWeight(tt.shares); got != tt.weight {
			t.Errorf("sharesToWeight(%d) = %d, want %d", tt.shares, got, tt.weight)
		}
	}
}

func TestParseKeyed(t *testing.T) {
	tests := []struct {
		name, data, key string
		want            uint64
		ok              bool
	}{
		{"v1 oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill", 3, true},
		{"v2 memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill", 1, true},
		{"prefix is not a match", "oom_kill_disable 1\n", "oom_kill", 0, false},
		{"pids.events", "max 7\n", "max", 7, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseKeyed([]byte(tt.data), tt.key)
			if got != tt.want || ok != tt.ok {
				t.Errorf("got %d %v, want %d %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestMissingControllers(t *testing.T) {
	tests := []struct {
		list string
		want []string
	}{
		{"cpuset cpu io memory hugetlb pids rdma misc\n", nil},
		{"hugetlb\n", []string{"memory", "cpu", "pids"}},
		{"cpu memory", []string{"pids"}},
	}
	for _, tt := range tests {
		if got := missingControllers(tt.list, v2Wanted); !slices.Equal(got, tt.want) {
			t.Errorf("missingControllers(%q) = %v, want %v", tt.list, got, tt.want)
		}
	}
}

// TestCgroupV2Host exercises the v2 code against this host's cgroup2 mount.
// On a v1 or hybrid host (like this CI machine) the controllers are bound to
// v1 hierarchies, so the check is that setup refuses with a clear error; on
// a v2 host the instance life cycle runs for real (as does the whole suite).
func TestCgroupV2Host(t *testing.T) {
	requireRoot(t)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := parseMountinfo(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var v2 *mountInfo
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			v2 = &m
			break
		}
	}
	if v2 == nil {
		t.Skip("no cgroup2 mounted on this host")
	}
	name := "/" + testConfig(t).CgroupName
	tree, err := newCgroupTree(cgroupLayout{Version: 2, V2: *v2}, map[string]string{}, name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(v2.MountPoint, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	if miss := missingControllers(string(b), v2Wanted); len(miss) > 0 {
		err := tree.setup()
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "lacks the "+strings.Join(miss, ", ")) {
			t.Fatalf("setup on a cgroup2 without %v: %v, want ErrUnavailable naming them", miss, err)
		}
		if exists(tree.parents[""]) {
			t.Errorf("setup created %s despite failing", tree.parents[""])
		}
		t.Logf("cgroup2 at %s has only %q: v2 instance cgroups cannot be exercised here (%v)", v2.MountPoint, strings.TrimSpace(string(b)), err)
		return
	}
	if err := tree.setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tree.removeParents(false); err != nil {
			t.Error(err)
		}
	})
	c, err := tree.create("v2-probe", Limits{MemoryMB: 64, CPUShares: 2048, Pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"memory.max": "67108864", "cpu.weight": "174", "pids.max": "10"} {
		b, err := os.ReadFile(filepath.Join(c.dirs[0], file))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q (%v), want %s", file, b, err, want)
		}
	}
	cmd := exec.Command("/bin/sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := writeCgroupFile(c.procsFiles()[0], strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.stats(); err != nil {
		t.Error(err)
	}
	if n, err := c.oomKills(); err != nil || n != 0 {
		t.Errorf("oomKills = %d, %v", n, err)
	}
	if err := c.killAll(); err != nil {
		t.Error(err)
	}
	_ = cmd.Wait()
	if err := c.remove(t.Context()); err != nil {
		t.Error(err)
	}
}
