package detect

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// mountinfoLimit bounds the read of /proc/self/mountinfo: a Kubernetes
// node can hold thousands of mounts, ~150 bytes each, and the cgroup
// mounts are not always among the first.
const mountinfoLimit = 4 << 20

// v1Unlimited is the least memory.limit_in_bytes that means no limit:
// cgroup v1 writes "unlimited" as the largest page-aligned int64
// (9223372036854771712 with 4 KiB pages, less with 64 KiB ones).
const v1Unlimited = 1 << 62

// cgroup reads the CPU, memory and cpuset limits of this process's
// cgroups, v2 and v1 alike (a hybrid host has both; each controller is
// in one hierarchy, so at most one of them limits each resource). A
// quota or memory limit is the tightest of the cgroup and every ancestor
// within its mount, as the kernel enforces them; the cpuset is the
// leaf's effective one. Paths come from /proc/self/cgroup, and the
// hierarchies' mount points from /proc/self/mountinfo (the usual places
// below /sys/fs/cgroup when it cannot be read).
func (f fsys) cgroup() hostinfo.Cgroup {
	c, _ := f.cgroupLimits()
	return c
}

// cgroupLimits is cgroup's limits, and the hierarchies whose limits are
// unknown rather than absent: the controllers among cpu, memory and
// cpuset ("cgroup2" for v2's, on a host that has none of them in v1)
// that /proc/self/cgroup puts this process under but that no mount shows.
// `ip netns exec` is one way to get there: it remounts /sys for the
// network namespace, and the cgroup file systems below it are gone,
// while the kernel still enforces their limits.
func (f fsys) cgroupLimits() (hostinfo.Cgroup, []string) {
	var c hostinfo.Cgroup
	self, _ := f.read("proc/self/cgroup")
	mounts := f.cgroupMounts()
	var unseen []string
	inV1, v2Unseen := false, false
	for _, line := range strings.Split(self, "\n") {
		_, rest, _ := strings.Cut(line, ":")
		ctrls, rel, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(rel, "/") {
			continue
		}
		for _, ctrl := range strings.Split(ctrls, ",") {
			m, mounted := mounts[ctrl]
			read := ctrl == "cpu" || ctrl == "memory" || ctrl == "cpuset"
			inV1 = inV1 || read
			switch {
			case mounted:
				f.limits(&c, ctrl, m, rel)
			case read:
				unseen = append(unseen, ctrl)
			case ctrl == "":
				v2Unseen = true
			}
		}
	}
	if v2Unseen && !inV1 {
		unseen = append(unseen, "cgroup2")
	}
	return c, unseen
}

// unseenProblem is the problem of a host whose cgroup hierarchies
// (cgroupLimits) are not mounted where detection runs.
func unseenProblem(unseen []string) string {
	return fmt.Sprintf("cgroup: this process is in cgroups (%s) that no mount shows here (nothing mounted below /sys/fs/cgroup, "+
		"as under ip netns exec, which remounts /sys): their memory and CPU limits are unknown, and plans count the whole host; "+
		"mount the cgroup file systems where the agent runs so that they are seen", strings.Join(unseen, ", "))
}

// cgroupMount is where a cgroup hierarchy is mounted: root is the
// hierarchy's directory shown there (not "/" in a container that mounts
// only its own subtree), dir the mount point.
type cgroupMount struct{ root, dir string }

// cgroupMounts maps the controllers detection reads ("cpu", "memory",
// "cpuset", and "" for the v2 hierarchy, as /proc/self/cgroup names it)
// to their mounts, from /proc/self/mountinfo; without it, the usual
// places: v2 at /sys/fs/cgroup, v1 controllers below it.
func (f fsys) cgroupMounts() map[string]cgroupMount {
	info, ok := f.readLimit("proc/self/mountinfo", mountinfoLimit)
	if !ok {
		return map[string]cgroupMount{
			"": {"/", "/sys/fs/cgroup"}, "cpu": {"/", "/sys/fs/cgroup/cpu"},
			"memory": {"/", "/sys/fs/cgroup/memory"}, "cpuset": {"/", "/sys/fs/cgroup/cpuset"},
		}
	}
	lines := strings.Split(info, "\n")
	if len(info) >= mountinfoLimit {
		lines = lines[:len(lines)-1] // cut short: the last line may be too
	}
	out := map[string]cgroupMount{}
	for _, line := range lines {
		// "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPEROPTS"
		pre, post, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		m := cgroupMount{unescapeMount(fields[3]), unescapeMount(fields[4])}
		switch tail[0] {
		case "cgroup2":
			if _, dup := out[""]; !dup {
				out[""] = m
			}
		case "cgroup":
			for _, opt := range strings.Split(tail[2], ",") {
				if _, dup := out[opt]; !dup && (opt == "cpu" || opt == "memory" || opt == "cpuset") {
					out[opt] = m
				}
			}
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline
// and backslash ("\040").
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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

// limits tightens c by the files of controller ctrl ("" for v2) for the
// cgroup rel, mounted at m.
func (f fsys) limits(c *hostinfo.Cgroup, ctrl string, m cgroupMount, rel string) {
	rel = path.Clean(rel)
	// Inside the mount's root, the cgroup is relative to it; a cgroup
	// namespace shows "/" for the root already.
	if r := path.Clean(m.root); r != "/" && (rel == r || strings.HasPrefix(rel, r+"/")) {
		rel = "/" + strings.TrimPrefix(strings.TrimPrefix(rel, r), "/")
	}
	dir := func(d string) string { return path.Join(m.dir, d) }
	for d := rel; ; d = path.Dir(d) {
		switch ctrl {
		case "":
			tighter(&c.CPUs, cpuMax(f.readOr(dir(d)+"/cpu.max")))
			tighterMem(&c.MemoryBytes, memMax(f.readOr(dir(d)+"/memory.max")))
		case "cpu":
			tighter(&c.CPUs, cfsQuota(f.readOr(dir(d)+"/cpu.cfs_quota_us"), f.readOr(dir(d)+"/cpu.cfs_period_us")))
		case "memory":
			tighterMem(&c.MemoryBytes, memMax(f.readOr(dir(d)+"/memory.limit_in_bytes")))
		}
		if d == "/" {
			break
		}
	}
	if c.CPUSet != nil {
		return
	}
	switch ctrl {
	case "":
		c.CPUSet, _ = f.list(dir(rel) + "/cpuset.cpus.effective")
	case "cpuset":
		var ok bool
		if c.CPUSet, ok = f.list(dir(rel) + "/cpuset.effective_cpus"); !ok {
			c.CPUSet, _ = f.list(dir(rel) + "/cpuset.cpus")
		}
	}
	if len(c.CPUSet) == 0 {
		c.CPUSet = nil // an empty cpuset is a cgroup without tasks: no limit of ours
	}
}

// tighter lowers *cur to cpus when cpus is a limit (> 0) below it.
func tighter(cur *float64, cpus float64) {
	if cpus > 0 && (*cur == 0 || cpus < *cur) {
		*cur = cpus
	}
}

// tighterMem lowers *cur to mem when mem is a limit (> 0) below it.
func tighterMem(cur *int64, mem int64) {
	if mem > 0 && (*cur == 0 || mem < *cur) {
		*cur = mem
	}
}

func (f fsys) readOr(p string) string { s, _ := f.read(p); return s }

// cpuMax is cpu.max's "QUOTA PERIOD" as CPUs (quota/period); 0 for "max"
// or an unreadable value.
func cpuMax(s string) float64 {
	q, p, ok := strings.Cut(s, " ")
	if !ok {
		return 0
	}
	return cfsQuota(q, p)
}

// cfsQuota is a quota and period (cgroup v1's cpu.cfs_quota_us and
// cpu.cfs_period_us, v2's cpu.max) as CPUs; 0 for no quota ("max", -1)
// or an unreadable value.
func cfsQuota(q, p string) float64 {
	quota, err1 := strconv.ParseFloat(q, 64)
	period, err2 := strconv.ParseFloat(p, 64)
	if err1 != nil || err2 != nil || !(quota > 0) || !(period > 0) || math.IsInf(quota, 0) || math.IsInf(period, 0) {
		return 0
	}
	return quota / period
}

// memMax is memory.max (v2) or memory.limit_in_bytes (v1) in bytes; 0
// for "max", v1's "unlimited" value or an unreadable value.
func memMax(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= v1Unlimited {
		return 0
	}
	return n
}
