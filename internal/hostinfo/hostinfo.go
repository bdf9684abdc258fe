// Package hostinfo is the value a host's hardware detection produces: its
// GPUs and how they connect, its CPUs and NUMA nodes, its network
// interfaces, and the limits of the cgroup the agent runs in. It is pure
// data (JSON in the agent's join and in `gtrain hosts topology`), shared by
// the detector (launch/detect, which reads go-nvml and sysfs), the
// launcher (binding) and the planner (planner.TopologyOf), none of which
// may import the others.
package hostinfo

import "strconv"

// Host is what detection found on one host. Absent parts are empty, with
// the reason in the matching *Error field: a host without an NVIDIA driver
// has no GPUs and GPUError says why; it is not an error of the host.
type Host struct {
	Name     string `json:"name,omitempty"`
	GPUs     []GPU  `json:"gpus"`
	GPUError string `json:"gpu_error,omitempty"` // why GPUs is empty (no driver, NVML failed)
	Driver   string `json:"driver,omitempty"`    // NVIDIA driver version
	CUDA     string `json:"cuda,omitempty"`      // the CUDA version the driver supports, "12.4"
	// Matrix is the GPU×GPU connection matrix, as `nvidia-smi topo -m`
	// prints it: Matrix[i][j] joins GPUs[i] and GPUs[j] (Self on the
	// diagonal); nil without GPUs.
	Matrix [][]Link   `json:"matrix,omitempty"`
	CPU    CPU        `json:"cpu"`
	NUMA   []NUMANode `json:"numa"`
	NICs   []NIC      `json:"nics"`
	Cgroup Cgroup     `json:"cgroup"`
	// Problems are what a user should fix or know (a GPU in a bad state,
	// MIG on, a GPU without NVLink beside GPUs with it), one line each.
	Problems []string `json:"problems,omitempty"`
}

// GPU is one NVIDIA GPU as NVML describes it.
type GPU struct {
	Index        int      `json:"index"`
	Name         string   `json:"name"` // "NVIDIA H100 80GB HBM3"
	UUID         string   `json:"uuid"`
	PCIBusID     string   `json:"pci_bus_id"` // "00000000:18:00.0"
	MemoryBytes  int64    `json:"memory_bytes"`
	ComputeMajor int      `json:"compute_major"`
	ComputeMinor int      `json:"compute_minor"`
	MIG          bool     `json:"mig"`
	NUMANode     int      `json:"numa_node"` // -1 when unknown
	CPUs         []int    `json:"cpus"`      // the cores NVML calls near (its CPU affinity)
	NVLinks      []NVLink `json:"nvlinks,omitempty"`
}

// NVLink is one NVLink of a GPU.
type NVLink struct {
	Link      int    `json:"link"`
	Active    bool   `json:"active"`
	Version   int    `json:"version"`
	RemoteBus string `json:"remote_pci_bus_id"` // the peer GPU's or NVSwitch's bus id
	ToSwitch  bool   `json:"to_switch"`
}

// LinkKind is a connection category of `nvidia-smi topo -m`, from the
// fastest to the slowest.
type LinkKind string

// The categories, as nvidia-smi names them.
const (
	Self       LinkKind = "X"    // the GPU itself
	NVLinkKind LinkKind = "NV"   // NV# in nvidia-smi: # bonded NVLinks (Link.NVLinks), directly or through NVSwitch
	PIX        LinkKind = "PIX"  // at most one PCIe bridge
	PXB        LinkKind = "PXB"  // several PCIe bridges, no host bridge
	PHB        LinkKind = "PHB"  // a PCIe host bridge (typically the CPU)
	NODE       LinkKind = "NODE" // PCIe host bridges within one NUMA node
	SYS        LinkKind = "SYS"  // across NUMA nodes (the SMP interconnect between sockets)
)

// Link is one cell of the GPU matrix.
type Link struct {
	Kind    LinkKind `json:"kind"`
	NVLinks int      `json:"nvlinks,omitempty"` // bonded NVLinks, for NVLinkKind
	P2P     bool     `json:"p2p"`               // CUDA peer-to-peer reads and writes are supported
}

// CPU is the host's processors as Linux lists them.
type CPU struct {
	Model   string `json:"model,omitempty"`
	Sockets int    `json:"sockets"`
	Cores   int    `json:"cores"`   // physical cores, all sockets
	Threads int    `json:"threads"` // logical CPUs online
	Online  []int  `json:"online"`  // the logical CPUs online
	// Siblings are the logical CPUs of each physical core (its hardware
	// threads, thread_siblings_list), so that binding to cores never
	// splits one; empty when unknown.
	Siblings [][]int `json:"siblings,omitempty"`
}

// NUMANode is one NUMA node: its logical CPUs and memory.
type NUMANode struct {
	ID          int   `json:"id"`
	CPUs        []int `json:"cpus"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// NIC is one network interface fit for training traffic.
type NIC struct {
	Name     string  `json:"name"`             // the netdev ("ib0", "eth0") or the IB device when it has none
	Kind     string  `json:"kind"`             // "ib", "roce" or "eth"
	Device   string  `json:"device,omitempty"` // the RDMA device ("mlx5_0"), for NCCL_IB_HCA
	Port     int     `json:"port,omitempty"`   // the RDMA port
	GbitPerS float64 `json:"gbit_per_s"`       // 0 when the link is down or the speed unknown
	Up       bool    `json:"up"`
	NUMANode int     `json:"numa_node"` // -1 when unknown
}

// Cgroup is the limits of the cgroup the detector ran in (0: no limit),
// from cgroup v2 or v1, whichever holds the controller.
type Cgroup struct {
	CPUs        float64 `json:"cpus,omitempty"`         // cpu.max (v1: cpu.cfs_quota_us) quota / period
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // memory.max (v1: memory.limit_in_bytes)
	CPUSet      []int   `json:"cpuset,omitempty"`       // cpuset.cpus.effective (v1: cpuset.effective_cpus)
}

// String is the cell as `nvidia-smi topo -m` prints it: "NV18", "PIX", "X".
func (l Link) String() string {
	if l.Kind == NVLinkKind {
		return "NV" + strconv.Itoa(l.NVLinks)
	}
	return string(l.Kind)
}
