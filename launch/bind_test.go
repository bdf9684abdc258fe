package launch

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// span is the CPUs lo..hi.
func span(lo, hi int) []int {
	var s []int
	for c := lo; c <= hi; c++ {
		s = append(s, c)
	}
	return s
}

// smtHost is a host of sockets NUMA nodes with cores physical cores each,
// two hardware threads per core, numbered as Linux does: first threads
// 0..N-1, their siblings N..2N-1.
func smtHost(name string, sockets, cores int) hostinfo.Host {
	h := hostinfo.Host{Name: name, CPU: hostinfo.CPU{Sockets: sockets, Cores: sockets * cores, Threads: 2 * sockets * cores}}
	n := sockets * cores
	for s := range sockets {
		first := span(s*cores, (s+1)*cores-1)
		second := span(n+s*cores, n+(s+1)*cores-1)
		h.NUMA = append(h.NUMA, hostinfo.NUMANode{ID: s, CPUs: slices.Concat(first, second)})
		for i := range first {
			h.CPU.Siblings = append(h.CPU.Siblings, []int{first[i], second[i]})
		}
	}
	h.CPU.Online = span(0, 2*n-1)
	return h
}

// dgxHost is DGX H100-like, scaled down: 2 sockets of 4 cores (SMT), 8
// GPUs, 0-3 on node 0 and 4-7 on node 1, 8 IB NICs, one per GPU, and an
// Ethernet port on each node.
func dgxHost() hostinfo.Host {
	h := smtHost("dgx", 2, 4)
	for i := range 8 {
		h.GPUs = append(h.GPUs, hostinfo.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", NUMANode: i / 4})
		h.NICs = append(h.NICs, hostinfo.NIC{Name: fmt.Sprintf("ibp%d", i), Kind: "ib", Device: fmt.Sprintf("mlx5_%d", i),
			Port: 1, GbitPerS: 400, Up: true, NUMANode: i / 4})
	}
	h.NICs = append(h.NICs, hostinfo.NIC{Name: "eno0", Kind: "eth", GbitPerS: 25, Up: true, NUMANode: 0},
		hostinfo.NIC{Name: "eno1", Kind: "eth", GbitPerS: 25, Up: true, NUMANode: 1})
	return h
}

// pcieHost is a 4-GPU PCIe box: two GPUs per socket, 2 sockets of 4
// cores without SMT, one 100G RoCE NIC per socket.
func pcieHost() hostinfo.Host {
	h := hostinfo.Host{Name: "pcie", CPU: hostinfo.CPU{Sockets: 2, Cores: 8, Threads: 8, Online: span(0, 7)},
		NUMA: []hostinfo.NUMANode{{ID: 0, CPUs: span(0, 3)}, {ID: 1, CPUs: span(4, 7)}}}
	for i := range 4 {
		h.GPUs = append(h.GPUs, hostinfo.GPU{Index: i, Name: "NVIDIA L40S", NUMANode: i / 2})
	}
	h.NICs = []hostinfo.NIC{
		{Name: "ens1", Kind: "roce", Device: "mlx5_0", Port: 1, GbitPerS: 100, Up: true, NUMANode: 0},
		{Name: "ens2", Kind: "roce", Device: "mlx5_1", Port: 1, GbitPerS: 100, Up: true, NUMANode: 1},
	}
	return h
}

// cpuHost is a CPU-only host: one NUMA node of n CPUs, one NIC.
func cpuHost(n int) hostinfo.Host {
	return hostinfo.Host{Name: "cpu", GPUError: "NVML: libnvidia-ml.so.1 not found", CPU: hostinfo.CPU{Sockets: 1, Cores: n, Threads: n, Online: span(0, n-1)},
		NUMA: []hostinfo.NUMANode{{ID: 0, CPUs: span(0, n-1)}},
		NICs: []hostinfo.NIC{{Name: "eth0", Kind: "eth", GbitPerS: 10, Up: true, NUMANode: -1}}}
}

// want is one rank's expected binding, compactly.
type want struct {
	mode          BindMode
	cpus          string // FormatCPUList
	threads, node int
	mem, gpu      int
	env           string // sorted KEY=VALUE, space-separated
}

func (w want) String() string {
	return fmt.Sprintf("%s cpus=%s threads=%d node=%d mem=%d gpu=%d env=[%s]", w.mode, w.cpus, w.threads, w.node, w.mem, w.gpu, w.env)
}

func got(b Binding) want {
	var env []string
	for k, v := range b.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return want{b.Mode, FormatCPUList(b.CPUs), b.Threads, b.NUMANode, b.MemNode, b.GPU, strings.Join(env, " ")}
}

func TestPlanBinding(t *testing.T) {
	dgx, pcie := dgxHost(), pcieHost()
	cpu2, cpu8 := cpuHost(2), cpuHost(8)
	twoNodes := smtHost("epyc", 2, 4) // CPU-only, two NUMA nodes, no NICs
	cgroup := cpuHost(8)
	cgroup.Cgroup.CPUSet = []int{2, 3, 6, 7}
	pcieSocket0 := pcieHost()
	pcieSocket0.Cgroup.CPUSet = []int{0, 1}
	dgxEnv := func(gpu int, hca, eth string, threads int) string {
		return fmt.Sprintf("CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ibp%d GTRAIN_CPUS=%d NCCL_IB_HCA==%s:1 NCCL_SOCKET_IFNAME==ibp%d OMP_NUM_THREADS=%d",
			gpu, threads, hca, gpu, threads)
	}
	tests := []struct {
		name  string
		host  hostinfo.Host
		mode  BindMode
		slots []int
		want  []want
	}{
		{"dgx core 8 ranks: a core of its GPU's socket each, and its own NIC", dgx, BindCore, span(0, 7), []want{
			{BindCore, "0,8", 2, 0, 0, 0, dgxEnv(0, "mlx5_0", "", 2)},
			{BindCore, "1,9", 2, 0, 0, 1, dgxEnv(1, "mlx5_1", "", 2)},
			{BindCore, "2,10", 2, 0, 0, 2, dgxEnv(2, "mlx5_2", "", 2)},
			{BindCore, "3,11", 2, 0, 0, 3, dgxEnv(3, "mlx5_3", "", 2)},
			{BindCore, "4,12", 2, 1, 1, 4, dgxEnv(4, "mlx5_4", "", 2)},
			{BindCore, "5,13", 2, 1, 1, 5, dgxEnv(5, "mlx5_5", "", 2)},
			{BindCore, "6,14", 2, 1, 1, 6, dgxEnv(6, "mlx5_6", "", 2)},
			{BindCore, "7,15", 2, 1, 1, 7, dgxEnv(7, "mlx5_7", "", 2)},
		}},
		{"dgx auto 2 ranks on GPUs 4,6 (a hostfile's slots): core on socket 1, whole cores", dgx, BindAuto, []int{4, 6}, []want{
			{BindCore, "4-5,12-13", 4, 1, 1, 4, dgxEnv(4, "mlx5_4", "", 4)},
			{BindCore, "6-7,14-15", 4, 1, 1, 6, dgxEnv(5, "mlx5_5", "", 4)},
		}},
		{"pcie gpu 4 ranks: one visible GPU each, its socket shared by two", pcie, BindGPU, span(0, 3), []want{
			{BindGPU, "0-3", 2, 0, 0, 0, "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=2"},
			{BindGPU, "0-3", 2, 0, 0, 1, "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=2"},
			{BindGPU, "4-7", 2, 1, 1, 2, "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2 GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=2"},
			{BindGPU, "4-7", 2, 1, 1, 3, "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3 GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=2"},
		}},
		{"pcie auto 4 ranks is numa: all GPUs stay visible (set_device(LOCAL_RANK))", pcie, BindAuto, span(0, 3), []want{
			{BindNUMA, "0-3", 2, 0, 0, 0, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=2"},
			{BindNUMA, "0-3", 2, 0, 0, 1, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=2"},
			{BindNUMA, "4-7", 2, 1, 1, 2, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=2"},
			{BindNUMA, "4-7", 2, 1, 1, 3, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=2 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=2"},
		}},
		{"pcie 6 ranks, more than GPUs: numa by CPUs alone, no GPU variables", pcie, BindNUMA, span(0, 5), []want{
			{BindNUMA, "0-3", 1, 0, 0, -1, "GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-3", 1, 0, 0, -1, "GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-3", 1, 0, 0, -1, "GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "4-7", 1, 1, 1, -1, "GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=1"},
			{BindNUMA, "4-7", 1, 1, 1, -1, "GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=1"},
			{BindNUMA, "4-7", 1, 1, 1, -1, "GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=1"},
		}},
		{"cpu-only 2 CPUs, 2 ranks, auto: a core each, one NIC is not named", cpu2, BindAuto, span(0, 1), []want{
			{BindCore, "0", 1, 0, -1, -1, "GTRAIN_CPUS=1 OMP_NUM_THREADS=1"},
			{BindCore, "1", 1, 0, -1, -1, "GTRAIN_CPUS=1 OMP_NUM_THREADS=1"},
		}},
		{"cpu-only 8 CPUs, 3 ranks, core: an even split, the first ranks smaller", cpu8, BindCore, span(0, 2), []want{
			{BindCore, "0-1", 2, 0, -1, -1, "GTRAIN_CPUS=2 OMP_NUM_THREADS=2"},
			{BindCore, "2-4", 3, 0, -1, -1, "GTRAIN_CPUS=3 OMP_NUM_THREADS=3"},
			{BindCore, "5-7", 3, 0, -1, -1, "GTRAIN_CPUS=3 OMP_NUM_THREADS=3"},
		}},
		{"cpu-only 2 CPUs, 3 ranks, auto shares (numa)", cpu2, BindAuto, span(0, 2), []want{
			{BindNUMA, "0-1", 1, 0, -1, -1, "GTRAIN_CPUS=1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-1", 1, 0, -1, -1, "GTRAIN_CPUS=1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-1", 1, 0, -1, -1, "GTRAIN_CPUS=1 OMP_NUM_THREADS=1"},
		}},
		{"cpu-only two NUMA nodes, 4 ranks core: two per node, whole cores, memory on the node", twoNodes, BindCore, span(0, 3), []want{
			{BindCore, "0-1,8-9", 4, 0, 0, -1, "GTRAIN_CPUS=4 OMP_NUM_THREADS=4"},
			{BindCore, "2-3,10-11", 4, 0, 0, -1, "GTRAIN_CPUS=4 OMP_NUM_THREADS=4"},
			{BindCore, "4-5,12-13", 4, 1, 1, -1, "GTRAIN_CPUS=4 OMP_NUM_THREADS=4"},
			{BindCore, "6-7,14-15", 4, 1, 1, -1, "GTRAIN_CPUS=4 OMP_NUM_THREADS=4"},
		}},
		{"cpu-only two NUMA nodes, 1 rank, core: node 0 only", twoNodes, BindCore, []int{0}, []want{
			{BindCore, "0-3,8-11", 8, 0, 0, -1, "GTRAIN_CPUS=8 OMP_NUM_THREADS=8"},
		}},
		{"cgroup cpuset: only its CPUs", cgroup, BindCore, span(0, 1), []want{
			{BindCore, "2-3", 2, 0, -1, -1, "GTRAIN_CPUS=2 OMP_NUM_THREADS=2"},
			{BindCore, "6-7", 2, 0, -1, -1, "GTRAIN_CPUS=2 OMP_NUM_THREADS=2"},
		}},
		{"cpuset on socket 0 only: the ranks of socket 1's GPUs share the CPUs there are", pcieSocket0, BindNUMA, span(0, 3), []want{
			{BindNUMA, "0-1", 1, 0, 0, 0, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-1", 1, 0, 0, 1, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-1", 1, -1, -1, 2, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens1 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens1 OMP_NUM_THREADS=1"},
			{BindNUMA, "0-1", 1, -1, -1, 3, "CUDA_DEVICE_ORDER=PCI_BUS_ID GLOO_SOCKET_IFNAME=ens2 GTRAIN_CPUS=1 NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens2 OMP_NUM_THREADS=1"},
		}},
		{"none binds nothing", dgx, BindNone, span(0, 1), []want{
			{BindNone, "", 0, -1, -1, -1, ""},
			{BindNone, "", 0, -1, -1, -1, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := PlanBinding(&tt.host, tt.mode, tt.slots)
			if err != nil {
				t.Fatal(err)
			}
			if len(bs) != len(tt.want) {
				t.Fatalf("%d bindings, want %d", len(bs), len(tt.want))
			}
			for i, b := range bs {
				if g := got(b); g != tt.want[i] {
					t.Errorf("local rank %d:\n got %v\nwant %v", i, g, tt.want[i])
				}
			}
		})
	}
}

func TestPlanBindingRefuses(t *testing.T) {
	dgx, cpu := dgxHost(), cpuHost(2)
	tests := []struct {
		name  string
		host  hostinfo.Host
		mode  BindMode
		slots []int
		want  []string
	}{
		{"core with more ranks than CPUs", cpu, BindCore, span(0, 2),
			[]string{"host cpu", "--bind core", "3 ranks", "2 CPUs (0-1)", "--bind numa"}},
		{"gpu on a host without GPUs", cpu, BindGPU, span(0, 1),
			[]string{"host cpu", "no GPUs", "libnvidia-ml.so.1 not found", "--bind numa or core"}},
		{"gpu with a slot that is no GPU", dgx, BindGPU, []int{7, 8},
			[]string{"host dgx", "slot 8", "GPUs (0-7)", "one rank per GPU"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanBinding(&tt.host, tt.mode, tt.slots)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestFormatCPUList(t *testing.T) {
	for in, want := range map[string]string{"": "", "0": "0", "0 1 2 3": "0-3", "3 0 1 8 10 11": "0-1,3,8,10-11"} {
		var cpus []int
		for _, f := range strings.Fields(in) {
			var c int
			fmt.Sscan(f, &c)
			cpus = append(cpus, c)
		}
		if g := FormatCPUList(cpus); g != want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", cpus, g, want)
		}
	}
}
