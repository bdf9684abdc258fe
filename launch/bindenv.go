package launch

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/gtrain/gtrain/launch/detect"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
)

// bindEnv is the environment binding b adds to a rank (where unset): its
// threads for OpenMP and the built-in engine, its GPU's numbering, and the
// NIC nearest its CPUs for NCCL and Gloo. pos is the rank's place among
// those sharing its NUMA node, so that ranks there spread over equally
// near NICs, as on a DGX, where each GPU has a NIC of its own.
func bindEnv(h *hostinfo.Host, b Binding, pos int) map[string]string {
	env := map[string]string{}
	if len(b.CPUs) > 0 {
		env["OMP_NUM_THREADS"] = strconv.Itoa(b.Threads)
		env[rankenv.CPUs] = strconv.Itoa(b.Threads)
	}
	if b.GPU >= 0 {
		// NVML, the hostfile's slots and the CPU affinity number GPUs in PCI
		// bus order; CUDA's default order is fastest first.
		env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
		if b.Mode == BindGPU {
			env["CUDA_VISIBLE_DEVICES"] = strconv.Itoa(b.GPU)
		}
	}
	if n := nearestNIC(h, b.NUMANode, pos, true); n != nil {
		hca := "=" + n.Device // "=": exactly this device, not every name it prefixes
		if n.Port > 0 {
			hca += ":" + strconv.Itoa(n.Port)
		}
		env["NCCL_IB_HCA"] = hca
	}
	if n := nearestNIC(h, b.NUMANode, pos, false); n != nil {
		env["NCCL_SOCKET_IFNAME"] = "=" + n.Name
		env["GLOO_SOCKET_IFNAME"] = n.Name
	}
	return env
}

// nearestNIC is the NIC a rank on NUMA node node should use: an RDMA
// device (rdma) or a network interface, up, on its node if any is, the
// fastest, the pos-th of equals. With fewer than two candidates there is
// nothing to choose, and nil leaves the choice to the library.
func nearestNIC(h *hostinfo.Host, node, pos int, rdma bool) *hostinfo.NIC {
	var cands []*hostinfo.NIC
	for i := range h.NICs {
		n := &h.NICs[i]
		ok := n.Up && n.Name != "lo"
		if rdma {
			ok = ok && (n.Kind == "ib" || n.Kind == "roce") && n.Device != ""
		} else {
			ok = ok && n.Name != "" && n.Name != n.Device
		}
		if ok {
			cands = append(cands, n)
		}
	}
	if len(cands) < 2 {
		return nil
	}
	near := func(n *hostinfo.NIC) bool { return node >= 0 && n.NUMANode == node }
	slices.SortStableFunc(cands, func(a, b *hostinfo.NIC) int {
		if near(a) != near(b) {
			if near(a) {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.GbitPerS, a.GbitPerS), cmp.Compare(a.Name, b.Name))
	})
	best := cands[:1]
	for _, n := range cands[1:] {
		if near(n) == near(cands[0]) && n.GbitPerS == cands[0].GbitPerS {
			best = append(best, n)
		}
	}
	return best[pos%len(best)]
}

// hasGPUs reports whether every slot is a GPU of h: the binding then
// follows the GPUs. Slots beyond the host's GPUs (more ranks than GPUs)
// bind by CPUs alone.
func hasGPUs(h *hostinfo.Host, slots []int) bool {
	if len(h.GPUs) == 0 {
		return false
	}
	for _, s := range slots {
		if gpuAt(h, s) == nil {
			return false
		}
	}
	return true
}

// gpuAt is the GPU of index i, or nil.
func gpuAt(h *hostinfo.Host, i int) *hostinfo.GPU {
	for j := range h.GPUs {
		if h.GPUs[j].Index == i {
			return &h.GPUs[j]
		}
	}
	return nil
}

// numaAt is NUMA node id, or nil.
func numaAt(h *hostinfo.Host, id int) *hostinfo.NUMANode {
	for j := range h.NUMA {
		if h.NUMA[j].ID == id {
			return &h.NUMA[j]
		}
	}
	return nil
}

// noGPUError explains why --bind gpu cannot give each rank a GPU.
func noGPUError(h *hostinfo.Host, slots []int) error {
	if len(h.GPUs) == 0 {
		why := cmp.Or(h.GPUError, "none detected")
		return fmt.Errorf("launch: host %s: --bind gpu: the host has no GPUs (%s): use --bind numa or core", hostName(h), why)
	}
	var have []int
	for _, g := range h.GPUs {
		have = append(have, g.Index)
	}
	for _, s := range slots {
		if gpuAt(h, s) == nil {
			return fmt.Errorf("launch: host %s: --bind gpu: slot %d is not one of its GPUs (%s): run at most one rank per GPU, or use --bind numa",
				hostName(h), s, FormatCPUList(have))
		}
	}
	return nil
}

// usableCPUs is the CPUs ranks on h may run on: those online (else those
// of its NUMA nodes), within the cgroup's cpuset when it has one.
func usableCPUs(h *hostinfo.Host) []int {
	cpus := slices.Clone(h.CPU.Online)
	if len(cpus) == 0 {
		for _, n := range h.NUMA {
			cpus = append(cpus, n.CPUs...)
		}
	}
	if len(h.Cgroup.CPUSet) > 0 {
		cpus = intersect(cpus, h.Cgroup.CPUSet)
	}
	slices.Sort(cpus)
	return slices.Compact(cpus)
}

// intersect is the CPUs of a that are also in b, ascending.
func intersect(a, b []int) []int {
	in := make(map[int]bool, len(b))
	for _, x := range b {
		in[x] = true
	}
	var out []int
	for _, x := range a {
		if in[x] {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// hostName names h in a message.
func hostName(h *hostinfo.Host) string {
	return cmp.Or(h.Name, "localhost")
}

// FormatCPUList writes CPU numbers as Linux lists them
// (/proc/self/status's Cpus_allowed_list, taskset -c): "0-3,8,10-11",
// sorted (detect.FormatList keeps the order given).
func FormatCPUList(cpus []int) string {
	s := slices.Clone(cpus)
	slices.Sort(s)
	return detect.FormatList(s)
}
