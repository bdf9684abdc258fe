package detect

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// cpus reads the online logical CPUs and counts sockets
// (topology/physical_package_id) and physical cores (distinct core_id
// within a socket), as lscpu does. The model comes from /proc/cpuinfo.
func (f fsys) cpus() hostinfo.CPU {
	online, ok := f.list("sys/devices/system/cpu/online")
	if !ok {
		online = f.numbered("sys/devices/system/cpu", "cpu")
	}
	c := hostinfo.CPU{Online: online, Threads: len(online), Model: f.cpuModel()}
	if c.Online == nil {
		c.Online = []int{}
	}
	sockets, cores := map[int]bool{}, map[[2]int]bool{}
	for _, id := range online {
		dir := fmt.Sprintf("sys/devices/system/cpu/cpu%d/topology/", id)
		pkg, ok1 := f.int(dir + "physical_package_id")
		core, ok2 := f.int(dir + "core_id")
		if !ok1 || !ok2 {
			continue
		}
		sockets[pkg] = true
		cores[[2]int{pkg, core}] = true
	}
	c.Sockets, c.Cores = len(sockets), len(cores)
	c.Siblings = f.siblings(online)
	return c
}

// maxThreadsPerCore bounds a core's hardware threads (POWER has 8): a
// longer thread_siblings_list is not one core's, and is ignored.
const maxThreadsPerCore = 16

// siblings groups the online CPUs by physical core from each CPU's
// topology/thread_siblings_list, so that core binding never splits a
// core's hardware threads between ranks. The groups are in the order of
// their first CPU, each listing its online CPUs in ascending order; nil
// when a CPU's list cannot be read or does not hold the CPU itself (the
// binding then treats every CPU as its own core).
func (f fsys) siblings(online []int) [][]int {
	isOnline := make(map[int]bool, len(online))
	for _, id := range online {
		isOnline[id] = true
	}
	var groups [][]int
	seen := map[int]bool{} // CPUs already in a group
	for _, id := range online {
		if seen[id] {
			continue
		}
		l, ok := f.list(fmt.Sprintf("sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", id))
		if !ok || len(l) > maxThreadsPerCore || !slices.Contains(l, id) {
			return nil
		}
		var g []int
		for _, s := range l {
			if isOnline[s] && !seen[s] {
				g = append(g, s)
				seen[s] = true
			}
		}
		slices.Sort(g)
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	return groups
}

// cpuModel is the first "model name" of /proc/cpuinfo (x86; arm64 kernels
// print none, and the model stays unknown).
func (f fsys) cpuModel() string {
	info, _ := f.read("proc/cpuinfo")
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// numa reads each NUMA node's CPUs and memory
// (/sys/devices/system/node/nodeN/{cpulist,meminfo}). A kernel without
// NUMA support has no node directory: the host is then one node 0 holding
// every online CPU and MemTotal of /proc/meminfo, as numactl shows it.
func (f fsys) numa(cpu hostinfo.CPU) []hostinfo.NUMANode {
	ids, ok := f.list("sys/devices/system/node/online")
	if !ok {
		ids = f.numbered("sys/devices/system/node", "node")
	}
	var nodes []hostinfo.NUMANode
	for _, id := range ids {
		dir := fmt.Sprintf("sys/devices/system/node/node%d/", id)
		cpus, _ := f.list(dir + "cpulist")
		if cpus == nil {
			cpus = []int{}
		}
		mem, _ := f.read(dir + "meminfo")
		nodes = append(nodes, hostinfo.NUMANode{ID: id, CPUs: cpus, MemoryBytes: memTotal(mem)})
	}
	if len(nodes) == 0 {
		mem, _ := f.read("proc/meminfo")
		nodes = []hostinfo.NUMANode{{ID: 0, CPUs: cpu.Online, MemoryBytes: memTotal(mem)}}
	}
	return nodes
}

// memTotal is the MemTotal line of a meminfo ("MemTotal: 16 kB", or a
// node's "Node 0 MemTotal: 16 kB"), in bytes; 0 when absent.
func memTotal(meminfo string) int64 {
	for _, line := range strings.Split(meminfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(strings.TrimSpace(k), "MemTotal") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil || kb < 0 || kb > 1<<50 {
			return 0
		}
		return kb << 10
	}
	return 0
}
