package launch

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// BindMode says what `gtrain run --bind` ties each rank to.
type BindMode string

// The binding modes. Every mode but none also names the nearest NIC for
// NCCL and Gloo, and, on a host with GPUs, picks the CPUs near the rank's
// GPU (its slot) and sets CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers the
// GPUs as NVML and the hostfile do.
const (
	// BindAuto is the default, mpirun's: core for at most 2 ranks on a
	// host, numa above (or when the cores are too few for core).
	BindAuto BindMode = "auto"
	// BindNone binds nothing: torchrun's behaviour.
	BindNone BindMode = "none"
	// BindGPU is numa, and each rank sees only its own GPU
	// (CUDA_VISIBLE_DEVICES = its slot): for programs that use cuda:0,
	// as under srun --gpus-per-task=1. LOCAL_RANK stays torchrun's, so
	// torch.cuda.set_device(LOCAL_RANK) fails there for LOCAL_RANK > 0.
	BindGPU BindMode = "gpu"
	// BindNUMA gives each rank the cores of its NUMA node (its GPU's),
	// shared with the node's other ranks, and memory there: mpirun
	// --bind-to numa.
	BindNUMA BindMode = "numa"
	// BindCore splits a NUMA node's cores evenly among its ranks, each rank
	// its own: mpirun --bind-to core, srun --cpu-bind=cores.
	BindCore BindMode = "core"
)

// ParseBindMode reads --bind.
func ParseBindMode(s string) (BindMode, error) {
	switch m := BindMode(s); m {
	case BindAuto, BindNone, BindGPU, BindNUMA, BindCore:
		return m, nil
	}
	return "", usage.Errorf("run: --bind %q: want none, gpu, numa, core or auto", s)
}

// Binding is what one rank is bound to on its host.
type Binding struct {
	Mode     BindMode `json:"mode"`           // the mode applied (auto resolved)
	CPUs     []int    `json:"cpus,omitempty"` // its CPU affinity; empty: not bound
	Threads  int      `json:"threads"`        // its share of CPUs: OMP_NUM_THREADS
	NUMANode int      `json:"numa_node"`      // where its CPUs are; -1: not one node
	MemNode  int      `json:"mem_node"`       // preferred memory node; -1: no policy
	GPU      int      `json:"gpu"`            // its GPU (the slot); -1: none
	pos      int      // its place among the ranks of its NUMA node
	// Env is what the binding adds to the rank's environment where the
	// user (or the host) has not set the variable already.
	Env map[string]string `json:"env,omitempty"`
}

// PlanBinding computes the binding of each rank of host h, where
// slots[i] is the slot of local rank i. It is pure: the agent applies
// what it returns, and --dry-run shows it.
func PlanBinding(h *hostinfo.Host, mode BindMode, slots []int) ([]Binding, error) {
	out := make([]Binding, len(slots))
	if mode == BindNone || len(slots) == 0 {
		for i := range out {
			out[i] = Binding{Mode: BindNone, NUMANode: -1, MemNode: -1, GPU: -1}
		}
		return out, nil
	}
	gpus := hasGPUs(h, slots)
	if mode == BindGPU && !gpus {
		return nil, noGPUError(h, slots)
	}
	pools := bindPools(h, slots, gpus)
	mode = resolveAuto(mode, pools, len(slots))
	for _, p := range pools {
		if err := p.assign(h, mode, out); err != nil {
			return nil, err
		}
	}
	for i := range out {
		if gpus {
			out[i].GPU = slots[i]
		}
		out[i].Env = bindEnv(h, out[i], out[i].pos)
	}
	return out, nil
}

// pool is a set of CPUs (one NUMA node's, or a GPU's affinity) and the
// local ranks that share it, in local-rank order.
type pool struct {
	node  int   // NUMA node; -1 when unknown
	cpus  []int // usable CPUs, ascending
	ranks []int // local ranks
}

// bindPools groups the ranks by the CPUs they should run on: with GPUs,
// the NUMA node of each rank's GPU; without, the NUMA nodes in turn, a
// block of neighbouring local ranks to each.
func bindPools(h *hostinfo.Host, slots []int, gpus bool) []*pool {
	allowed := usableCPUs(h)
	nodes := map[int]*pool{}
	var order []*pool
	at := func(node int, cpus []int) *pool {
		if p, ok := nodes[node]; ok {
			return p
		}
		p := &pool{node: node, cpus: intersect(cpus, allowed)}
		nodes[node] = p
		order = append(order, p)
		return p
	}
	if gpus {
		for i, s := range slots {
			g := gpuAt(h, s)
			node, cpus := g.NUMANode, g.CPUs
			if n := numaAt(h, node); n != nil {
				cpus = n.CPUs
			} else {
				node = -1 - g.Index // a pool of the GPU's own affinity
			}
			if len(intersect(cpus, allowed)) == 0 {
				// Unknown, or none the agent may use (a scheduler gave it
				// cores on another socket): the CPUs it has, shared.
				node, cpus = -1, allowed
			}
			p := at(node, cpus)
			p.ranks = append(p.ranks, i)
		}
		return order
	}
	var numa []hostinfo.NUMANode
	for _, n := range h.NUMA {
		if len(intersect(n.CPUs, allowed)) > 0 {
			numa = append(numa, n)
		}
	}
	if len(numa) == 0 {
		numa = []hostinfo.NUMANode{{ID: -1, CPUs: allowed}}
	}
	for i := range slots {
		n := numa[i*len(numa)/len(slots)]
		p := at(n.ID, n.CPUs)
		p.ranks = append(p.ranks, i)
	}
	return order
}

// resolveAuto is mpirun's default: core for at most 2 ranks, numa above,
// and numa where some pool has fewer CPUs than ranks (auto never refuses).
func resolveAuto(mode BindMode, pools []*pool, ranks int) BindMode {
	if mode != BindAuto {
		return mode
	}
	if ranks > 2 {
		return BindNUMA
	}
	for _, p := range pools {
		if len(p.cpus) < len(p.ranks) {
			return BindNUMA
		}
	}
	return BindCore
}

// assign binds the pool's ranks: under core each gets its own even share
// of the pool's cores (whole cores while there are enough), else all
// share the pool.
func (p *pool) assign(h *hostinfo.Host, mode BindMode, out []Binding) error {
	if len(p.cpus) == 0 {
		return fmt.Errorf("launch: host %s: no CPU this agent may use is on NUMA node %d (cgroup cpuset %v): use --bind none",
			hostName(h), p.node, h.Cgroup.CPUSet)
	}
	k := len(p.ranks)
	if mode == BindCore && k > len(p.cpus) {
		return fmt.Errorf("launch: host %s: --bind core: %d ranks share %s, which has %d CPUs (%s): each rank needs its own; use --bind numa to share them, or fewer ranks",
			hostName(h), k, p.where(), len(p.cpus), FormatCPUList(p.cpus))
	}
	units := coreUnits(h, p.cpus, k)
	mem := -1
	if p.node >= 0 && len(h.NUMA) > 1 {
		mem = p.node // one node has nothing to prefer
	}
	node := max(p.node, -1)
	for j, r := range p.ranks {
		b := Binding{Mode: mode, NUMANode: node, MemNode: mem, GPU: -1, CPUs: p.cpus, Threads: max(1, len(p.cpus)/k), pos: j}
		if mode == BindCore {
			b.CPUs = slices.Concat(units[j*len(units)/k : (j+1)*len(units)/k]...)
			slices.Sort(b.CPUs)
			b.Threads = len(b.CPUs)
		}
		out[r] = b
	}
	return nil
}

// where names the pool in a message.
func (p *pool) where() string {
	if p.node >= 0 {
		return "NUMA node " + strconv.Itoa(p.node)
	}
	return "the CPUs near their GPU"
}

// coreUnits are the pool's CPUs grouped by physical core (hardware
// threads of one core together), so that core binding never gives two
// ranks the two threads of one core; single CPUs when there are fewer
// cores than ranks, or the siblings are unknown.
func coreUnits(h *hostinfo.Host, cpus []int, ranks int) [][]int {
	var units [][]int
	placed := map[int]bool{}
	for _, c := range cpus {
		if placed[c] {
			continue
		}
		u := []int{c}
		for _, s := range siblingsOf(h, c) {
			if s != c && !placed[s] && slices.Contains(cpus, s) {
				u = append(u, s)
			}
		}
		for _, x := range u {
			placed[x] = true
		}
		units = append(units, u)
	}
	if len(units) < ranks {
		units = units[:0]
		for _, c := range cpus {
			units = append(units, []int{c})
		}
	}
	return units
}

// siblingsOf is the hardware threads of cpu's core, from the detected
// topology; nil when unknown.
func siblingsOf(h *hostinfo.Host, cpu int) []int {
	for _, s := range h.CPU.Siblings {
		if slices.Contains(s, cpu) {
			return s
		}
	}
	return nil
}
