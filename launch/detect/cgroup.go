package detect

import (
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// cgroup reads the cgroup v2 limits of this process: cpu.max and memory.max
// of its cgroup and every ancestor (the tightest wins, as the kernel
// enforces them), and the leaf's cpuset.cpus.effective. The cgroup is the
// "0::/path" line of /proc/self/cgroup; under a cgroup namespace (a
// container) it is "/" and the files are at the mount's root. cgroup v1
// hosts get no limits: detection reports what it can read, not a guess.
func (f fsys) cgroup() hostinfo.Cgroup {
	var c hostinfo.Cgroup
	self, _ := f.read("proc/self/cgroup")
	rel := ""
	for _, line := range strings.Split(self, "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = path.Clean("/" + p)
		}
	}
	if rel == "" {
		return c
	}
	for dir := rel; ; dir = path.Dir(dir) {
		base := path.Join("sys/fs/cgroup", dir)
		if cpus := cpuMax(f.readOr(base + "/cpu.max")); cpus > 0 && (c.CPUs == 0 || cpus < c.CPUs) {
			c.CPUs = cpus
		}
		if mem := memMax(f.readOr(base + "/memory.max")); mem > 0 && (c.MemoryBytes == 0 || mem < c.MemoryBytes) {
			c.MemoryBytes = mem
		}
		if dir == "/" {
			break
		}
	}
	c.CPUSet, _ = f.list(path.Join("sys/fs/cgroup", rel, "cpuset.cpus.effective"))
	return c
}

func (f fsys) readOr(p string) string { s, _ := f.read(p); return s }

// cpuMax is cpu.max's "QUOTA PERIOD" as CPUs (quota/period); 0 for "max"
// or an unreadable value.
func cpuMax(s string) float64 {
	q, p, ok := strings.Cut(s, " ")
	quota, err1 := strconv.ParseFloat(q, 64)
	period, err2 := strconv.ParseFloat(p, 64)
	if !ok || err1 != nil || err2 != nil || !(quota > 0) || !(period > 0) || math.IsInf(quota, 0) {
		return 0
	}
	return quota / period
}

// memMax is memory.max in bytes; 0 for "max" or an unreadable value.
func memMax(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
