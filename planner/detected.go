package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// TopologyOf turns the hosts detection found into the cluster the planner
// plans for: one node per host, the GPU from the catalog by NVML's name and
// memory, the link between a node's GPUs from its NVLinks (NVSwitch or
// direct, at the generation's rate) or PCIe, and the network from each
// host's fastest NICs, at most one per GPU (NCCL gives a GPU one rail).
//
// The planner's nodes are identical. Hosts that differ in GPU model,
// links or network are planned for the weakest of each, and a warning for
// each difference comes back for the caller to print; hosts with unequal
// GPU counts, GPUs on some hosts only, or a GPU the catalog lacks are
// refused with the reason. Hosts without GPUs are the built-in engine's:
// CPUTopologyOf with one rank per NUMA node.
func TopologyOf(hosts []hostinfo.Host) (Topology, []string, error) {
	if len(hosts) == 0 {
		return Topology{}, nil, fmt.Errorf("planner: detected hosts: none")
	}
	gpus := len(hosts[0].GPUs)
	for i, h := range hosts {
		if len(h.GPUs) != gpus {
			return Topology{}, nil, fmt.Errorf("planner: detected hosts: %s has %d GPUs and %s %d: the planner needs the same GPUs on every node; leave out the hosts that differ (--exclude) or plan with --gpus N --gpus-per-node G",
				hostName(hosts[0], 0), gpus, hostName(h, i), len(h.GPUs))
		}
	}
	if gpus == 0 {
		ranks := make([]int, len(hosts))
		for i, h := range hosts {
			ranks[i] = max(len(h.NUMA), 1)
		}
		return CPUTopologyOf(hosts, ranks)
	}
	return gpuTopologyOf(hosts)
}

// gpuTopologyOf is TopologyOf for hosts with the same number of GPUs.
func gpuTopologyOf(hosts []hostinfo.Host) (Topology, []string, error) {
	top := Topology{Nodes: len(hosts), GPUsPerNode: len(hosts[0].GPUs)}
	var warns []string
	gpus, intras, inters := make([]GPU, len(hosts)), make([]Link, len(hosts)), make([]Link, len(hosts))
	for i, h := range hosts {
		e, w, err := hostGPU(h, i)
		if err != nil {
			return Topology{}, nil, err
		}
		warns = append(warns, w...)
		gpus[i], intras[i] = e.GPU, intraOf(h, e)
		inters[i], w = interOf(h, i, top.GPUsPerNode)
		warns = append(warns, w...)
	}
	top.GPU, warns = weakest(hosts, gpus, func(g GPU) string { return g.Name }, compareGPU, "GPU", warns)
	top.Intra, warns = weakest(hosts, intras, Link.Describe, compareLink, "GPU link", warns)
	top.Inter, warns = weakest(hosts, inters, Link.Describe, compareLink, "network", warns)
	if top.Nodes == 1 {
		top.Inter = Link{Kind: "none"}
	}
	return top, warns, top.Validate()
}

// hostGPU is the catalog entry of h's GPUs. A host mixing models is
// planned with its weakest GPU, and says so.
func hostGPU(h hostinfo.Host, i int) (CatalogEntry, []string, error) {
	var (
		best  CatalogEntry
		names []string
	)
	for k, g := range h.GPUs {
		e, err := catalogGPU(g)
		if err != nil {
			return CatalogEntry{}, nil, fmt.Errorf("planner: %s, GPU %d: %w", hostName(h, i), g.Index, err)
		}
		if k == 0 || compareGPU(e.GPU, best.GPU) < 0 {
			best = e
		}
		if !slices.Contains(names, e.GPU.Name) {
			names = append(names, e.GPU.Name)
		}
	}
	if len(names) > 1 {
		return best, []string{fmt.Sprintf("%s mixes GPUs (%s): planning every GPU as a %s", hostName(h, i), strings.Join(names, ", "), best.GPU.Name)}, nil
	}
	return best, nil, nil
}

// catalogGPU finds NVML's GPU name ("NVIDIA H100 80GB HBM3",
// "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB") in the catalog; the
// memory tells an A100's 40 GB part from its 80 GB one.
func catalogGPU(g hostinfo.GPU) (CatalogEntry, error) {
	name := strings.ToUpper(g.Name)
	gb := float64(g.MemoryBytes) / gib
	key := ""
	switch {
	case strings.Contains(name, "H200"):
		key = "H200"
	case strings.Contains(name, "H100") && strings.Contains(name, "PCIE"):
		key = "H100-PCIE"
	case strings.Contains(name, "H100"):
		key = "H100"
	case strings.Contains(name, "A100") && gb > 60:
		key = "A100-80GB"
	case strings.Contains(name, "A100"):
		key = "A100-40GB"
	case strings.Contains(name, "V100"):
		key = "V100-32GB"
	case strings.Contains(name, "L40S"):
		key = "L40S"
	case slices.Contains(strings.Fields(strings.NewReplacer("-", " ").Replace(name)), "A10"):
		key = "A10"
	}
	e, ok := Catalog[key]
	if !ok {
		return CatalogEntry{}, fmt.Errorf("%q (%.0f GiB) is not in the planner's catalog (%s): describe the cluster in a --topology file", g.Name, gb, strings.Join(sortedKeys(Catalog), ", "))
	}
	if g.MemoryBytes > 0 && float64(g.MemoryBytes) < 0.85*float64(e.GPU.MemoryBytes) {
		// A smaller variant (a 16 GB V100): what NVML reports is what fits.
		e.GPU.MemoryBytes = g.MemoryBytes
	}
	return e, nil
}

// nvlinkGbit is one NVLink's rate per direction by NVLink version, Gb/s:
// 20 GB/s for NVLink 1 (P100), 25 GB/s for 2–4 (V100, A100, H100), 50 GB/s
// for 5 (B200).
var nvlinkGbit = map[int]float64{1: 160, 2: 200, 3: 200, 4: 200, 5: 400}

// intraOf is h's link between GPUs: its NVLinks when every GPU has them
// (the fewest active links of a GPU, through NVSwitches when they end at
// one), else PCIe: the catalog's PCIe link for a PCIe part, else the
// generation of the compute capability (PCIe 5 from Hopper on).
func intraOf(h hostinfo.Host, e CatalogEntry) Link {
	links, version, toSwitch := math.MaxInt, 0, true
	for _, g := range h.GPUs {
		n := 0
		for _, l := range g.NVLinks {
			if l.Active {
				n++
				version = max(version, l.Version)
				toSwitch = toSwitch && l.ToSwitch
			}
		}
		links = min(links, n)
	}
	if rate := nvlinkGbit[version]; links > 0 && rate > 0 {
		kind := "nvlink"
		if toSwitch {
			kind = "nvswitch"
		}
		return Link{Kind: kind, Count: links, GbitPerS: rate}
	}
	if strings.HasPrefix(e.Intra.Kind, "pcie") {
		return e.Intra
	}
	if h.GPUs[0].ComputeMajor >= 9 {
		return Link{Kind: "pcie5", GbitPerS: 512}
	}
	return Link{Kind: "pcie4", GbitPerS: 256}
}

// interOf is h's network: the NICs that are up at the fastest rate, RDMA
// ones (InfiniBand, RoCE) before plain Ethernet, at most one per GPU. A
// host without a NIC of known speed is assumed on 10 GbE, and says so.
func interOf(h hostinfo.Host, i, gpus int) (Link, []string) {
	var best Link
	for _, rdma := range []bool{true, false} {
		for _, n := range h.NICs {
			if !n.Up || !(n.GbitPerS > 0) || (n.Kind != "eth") != rdma {
				continue
			}
			switch {
			case n.GbitPerS > best.GbitPerS:
				best = Link{Kind: n.Kind, Count: 1, GbitPerS: n.GbitPerS}
			case n.GbitPerS == best.GbitPerS:
				best.Count++
			}
		}
		if best.GbitPerS > 0 {
			best.Count = min(best.Count, max(gpus, 1))
			return best, nil
		}
	}
	return Link{Kind: "eth", Count: 1, GbitPerS: assumedGbitPerS},
		[]string{fmt.Sprintf("%s: no network interface up with a known speed: assuming %d GbE", hostName(h, i), assumedGbitPerS)}
}

// assumedGbitPerS is the network of a host whose NICs detection could not
// rate (a VM's virtio, which has no speed): 10 GbE, as CPUTopology assumes.
const assumedGbitPerS = 10

// weakest is the least of vals by cmp; when the hosts differ it adds a
// warning naming the hosts with the least.
func weakest[T any](hosts []hostinfo.Host, vals []T, show func(T) string, less func(a, b T) int, what string, warns []string) (T, []string) {
	w := slices.MinFunc(vals, less)
	var differ, weak []string
	for i, v := range vals {
		if show(v) != show(w) {
			differ = append(differ, show(v))
		} else {
			weak = append(weak, hostName(hosts[i], i))
		}
	}
	if len(differ) > 0 {
		warns = append(warns, fmt.Sprintf("hosts differ in %s: planning every node as %s (%s) rather than %s", what, strings.Join(weak, ", "), show(w), strings.Join(slices.Compact(slices.Sorted(slices.Values(differ))), ", ")))
	}
	return w, warns
}

// compareGPU orders GPUs weakest first: less peak, then less memory.
func compareGPU(a, b GPU) int {
	return cmp.Or(cmp.Compare(a.PeakFLOPS, b.PeakFLOPS), cmp.Compare(a.MemoryBytes, b.MemoryBytes))
}

// compareLink orders links slowest first.
func compareLink(a, b Link) int { return cmp.Compare(a.BytesPerSec(), b.BytesPerSec()) }

// hostName is h's name, or "host i" when detection did not learn it.
func hostName(h hostinfo.Host, i int) string {
	if h.Name != "" {
		return h.Name
	}
	return fmt.Sprintf("host %d", i)
}

// CPUTopologyOf is CPUTopology for detected hosts without GPUs,
// ranksPerHost[i] being host i's ranks: each host's memory is its NUMA
// nodes' (or its cgroup's memory.max, when lower) and its cores its online
// CPUs (or its cgroup's cpuset or cpu.max, when fewer); unequal hosts are
// planned as the smallest, with a warning. The speeds and links are
// DefaultCPUSpeed's (CPUTopologyWith takes measured ones): a NIC's rate
// says little about what the engine's TCP reaches.
func CPUTopologyOf(hosts []hostinfo.Host, ranksPerHost []int) (Topology, []string, error) {
	return CPUTopologyWith(hosts, ranksPerHost, CPUFigures{Speed: DefaultCPUSpeed})
}

// CPUFigures is what CPUTopologyWith knows of the ranks besides the
// hosts' facts.
type CPUFigures struct {
	// Speed is the engine's speed per core: measured on the engine's own
	// kernels (engine/train.MeasureCPU) where the caller has it, else
	// DefaultCPUSpeed. A zero figure is DefaultCPUSpeed's.
	Speed CPUSpeed
	// RankCPUs, when > 0, is the CPUs each rank computes on: what gtrain
	// run --bind gives it (its mask, GTRAIN_CPUS), the fewest of any rank.
	// 0: the ranks share their host's CPUs, cores ÷ ranks each.
	RankCPUs int
}

// CPUTopologyWith is CPUTopologyOf at the speed and with the per-rank
// CPUs of f. The ranks of a host never get more CPUs than it has (its
// cgroup's quota included), whatever f says.
func CPUTopologyWith(hosts []hostinfo.Host, ranksPerHost []int, f CPUFigures) (Topology, []string, error) {
	if len(hosts) == 0 || len(ranksPerHost) != len(hosts) {
		return Topology{}, nil, fmt.Errorf("planner: detected hosts: %d hosts and %d rank counts", len(hosts), len(ranksPerHost))
	}
	mems, cpus := make([]int64, len(hosts)), make([]int, len(hosts))
	for i, h := range hosts {
		mems[i], cpus[i] = hostMemory(h), hostCPUs(h)
	}
	mem, cpu := slices.Min(mems), slices.Min(cpus)
	var warns []string
	if mem != slices.Max(mems) || cpu != slices.Max(cpus) {
		warns = append(warns, fmt.Sprintf("hosts differ in memory or CPUs: planning every host with %.1f GiB and %d CPUs, the least of them", float64(mem)/gib, cpu))
	}
	if mem <= 0 || cpu <= 0 {
		return Topology{}, warns, fmt.Errorf("planner: detected hosts: a host's memory or CPUs are unknown: plan with --gpus N instead")
	}
	if per := slices.Max(ranksPerHost); f.RankCPUs > 0 && per > 0 {
		// Speed.Topology gives each rank cores ÷ ranks: bound ranks have
		// their masks instead, which need not split the host evenly (core
		// binding keeps a core's threads together), within what the
		// cgroup's quota leaves the host.
		cpu = min(f.RankCPUs*per, cpu)
	}
	top := f.Speed.orDefault().Topology(ranksPerHost, mem, cpu)
	return top, warns, top.Validate()
}

// orDefault is s with DefaultCPUSpeed's figure wherever s has none.
func (s CPUSpeed) orDefault() CPUSpeed {
	d := DefaultCPUSpeed
	pick := func(v, def float64) float64 {
		if v > 0 {
			return v
		}
		return def
	}
	return CPUSpeed{
		GEMMFLOPSPerCore:         pick(s.GEMMFLOPSPerCore, d.GEMMFLOPSPerCore),
		KernelBytesPerSecPerCore: pick(s.KernelBytesPerSecPerCore, d.KernelBytesPerSecPerCore),
		SHMBytesPerSec:           pick(s.SHMBytesPerSec, d.SHMBytesPerSec),
		TCPBytesPerSec:           pick(s.TCPBytesPerSec, d.TCPBytesPerSec),
	}
}

// HostMemory is the memory CPUTopologyWith gives h's ranks together: its
// NUMA nodes' total, capped by its cgroup's limit. Callers show it beside
// a plan, so that a user sees which figure each host was planned with.
func HostMemory(h hostinfo.Host) int64 { return hostMemory(h) }

// HostCPUs is the CPUs CPUTopologyWith gives h's ranks together (before
// --bind's share of each rank).
func HostCPUs(h hostinfo.Host) int { return hostCPUs(h) }

// hostMemory is h's memory for ranks: its NUMA nodes' total, capped by its
// cgroup's memory.max.
func hostMemory(h hostinfo.Host) int64 {
	var mem int64
	for _, n := range h.NUMA {
		mem += n.MemoryBytes
	}
	if c := h.Cgroup.MemoryBytes; c > 0 && (mem == 0 || c < mem) {
		mem = c
	}
	return mem
}

// hostCPUs is h's CPUs for ranks: the online ones, capped by the cgroup's
// cpuset and its cpu.max quota (rounded down, at least 1).
func hostCPUs(h hostinfo.Host) int {
	n := h.CPU.Threads
	if s := len(h.Cgroup.CPUSet); s > 0 && (n == 0 || s < n) {
		n = s
	}
	if q := h.Cgroup.CPUs; q > 0 && (n == 0 || int(q) < n) {
		n = max(int(q), 1)
	}
	return n
}
