package detect

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// fixtureRoot extracts testdata/name into a temporary root (without
// the mock NVML fixture's build constraints).
func fixtureRoot(t *testing.T, name string) fsys {
	t.Helper()
	ar, err := txtar.ParseFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if len(ar.Files) == 0 {
		t.Fatalf("%s: no files", name)
	}
	root := t.TempDir()
	if err := txtar.Write(ar, root); err != nil {
		t.Fatal(err)
	}
	return fsys{root: root}
}

// TestCgroup: the limits of cgroup v1 (a Slurm step on a hybrid host, a
// Docker container whose mounts show only its own cgroup) and v2 (a
// Kubernetes container, a Slurm job with the files where they usually
// are) are read through /proc/self/cgroup and /proc/self/mountinfo.
func TestCgroup(t *testing.T) {
	for _, tt := range []struct {
		fixture string
		want    hostinfo.Cgroup
	}{
		{"cgroup-v1-slurm.txtar", hostinfo.Cgroup{CPUs: 4, MemoryBytes: 64 << 30, CPUSet: []int{2, 3, 4, 5}}},
		{"cgroup-v1-docker.txtar", hostinfo.Cgroup{CPUs: 1.5, MemoryBytes: 2 << 30, CPUSet: []int{0, 2}}},
		{"cgroup-v2-container.txtar", hostinfo.Cgroup{CPUs: 2.5, MemoryBytes: 3 << 30, CPUSet: []int{4, 5, 6, 7}}},
		{"dgx-h100.txtar", hostinfo.Cgroup{CPUs: 8, MemoryBytes: 512 << 30, CPUSet: span(0, 15)}},
		{"pcie-4gpu.txtar", hostinfo.Cgroup{}},
	} {
		t.Run(tt.fixture, func(t *testing.T) {
			got := fixtureRoot(t, tt.fixture).cgroup()
			if got.CPUs != tt.want.CPUs || got.MemoryBytes != tt.want.MemoryBytes || !slices.Equal(got.CPUSet, tt.want.CPUSet) {
				t.Errorf("cgroup = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func span(lo, hi int) []int {
	var s []int
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}

// TestCgroupValues: v1's no-limit spellings are no limit.
func TestCgroupValues(t *testing.T) {
	for _, tt := range []struct {
		q, p string
		want float64
	}{{"-1", "100000", 0}, {"50000", "100000", 0.5}, {"max", "100000", 0}, {"100000", "0", 0}, {"", "", 0}} {
		if got := cfsQuota(tt.q, tt.p); got != tt.want {
			t.Errorf("cfsQuota(%q, %q) = %v, want %v", tt.q, tt.p, got, tt.want)
		}
	}
	for s, want := range map[string]int64{"9223372036854771712": 0, "9223372036854710272": 0, "max": 0, "1073741824": 1 << 30, "-1": 0} {
		if got := memMax(s); got != want {
			t.Errorf("memMax(%q) = %d, want %d", s, got, want)
		}
	}
	for s, want := range map[string]string{`/a\040b`: "/a b", `/a\134b`: `/a\b`, `/a\04`: `/a\04`, `/plain`: "/plain"} {
		if got := unescapeMount(s); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", s, got, want)
		}
	}
}

// TestCgroupUnseen: a process whose cgroups no mount shows (a network
// namespace entered with ip netns exec, which remounts /sys) has limits
// that are unknown, not absent: cgroupLimits names those hierarchies, and
// reads the ones mounted again there. The fixtures of TestCgroup, whose
// hierarchies are all mounted, name none.
func TestCgroupUnseen(t *testing.T) {
	const sysfsOnly = "52 49 0:39 / /sys rw,relatime - sysfs h1 rw\n"
	const v1Self = "9:name=systemd:/\n4:memory:/api/x/gtrain-test\n3:cpuset:/\n1:cpu:/\n0::/\n"
	for _, tt := range []struct {
		name   string
		files  map[string]string
		mem    int64
		unseen []string
	}{
		{"v1 in ip netns exec", map[string]string{"proc/self/cgroup": v1Self, "proc/self/mountinfo": sysfsOnly}, 0, []string{"memory", "cpuset", "cpu"}},
		{"v2 in ip netns exec", map[string]string{"proc/self/cgroup": "0::/user.slice/job\n", "proc/self/mountinfo": sysfsOnly}, 0, []string{"cgroup2"}},
		{"v1 with memory mounted again", map[string]string{"proc/self/cgroup": v1Self,
			"proc/self/mountinfo": sysfsOnly + "60 52 0:50 / /sys/fs/cgroup rw - tmpfs t rw\n61 60 0:32 / /sys/fs/cgroup/memory rw - cgroup t rw,memory\n",
			"sys/fs/cgroup/memory/api/x/gtrain-test/memory.limit_in_bytes": "335544320\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                   "9223372036854771712\n"}, 320 << 20, []string{"cpuset", "cpu"}},
		{"no cgroup file", map[string]string{"proc/self/mountinfo": sysfsOnly}, 0, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for name, body := range tt.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c, unseen := fsys{root: root}.cgroupLimits()
			if c.MemoryBytes != tt.mem || !slices.Equal(unseen, tt.unseen) {
				t.Errorf("memory %d, unseen %q; want %d, %q", c.MemoryBytes, unseen, tt.mem, tt.unseen)
			}
		})
	}
	for _, fixture := range []string{"cgroup-v1-slurm.txtar", "cgroup-v1-docker.txtar", "cgroup-v2-container.txtar", "dgx-h100.txtar"} {
		if _, unseen := fixtureRoot(t, fixture).cgroupLimits(); len(unseen) > 0 {
			t.Errorf("%s: unseen %q, want none", fixture, unseen)
		}
	}
	if p := unseenProblem([]string{"memory"}); !strings.Contains(p, "cgroups (memory) that no mount shows here") {
		t.Errorf("problem %q", p)
	}
}
