//go:build linux && cgo

package detect

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

func TestDGXH100(t *testing.T) {
	h := detect(context.Background(), fixture(t, "dgx-h100.txtar"), dgxH100().scan())
	if len(h.GPUs) != 8 || h.GPUError != "" {
		t.Fatalf("%d GPUs (%q): want 8", len(h.GPUs), h.GPUError)
	}
	if h.Driver != "550.54.15" || h.CUDA != "12.4" {
		t.Errorf("driver %q, CUDA %q: want 550.54.15, 12.4", h.Driver, h.CUDA)
	}
	for i, g := range h.GPUs {
		if g.Index != i || g.Name != "NVIDIA H100 80GB HBM3" || g.MemoryBytes != 81559<<20 || g.ComputeMajor != 9 || g.MIG {
			t.Errorf("GPU %d = %+v", i, g)
		}
		if g.NUMANode != i/4 || len(g.CPUs) != 8 || g.CPUs[0] != 4*(i/4) {
			t.Errorf("GPU %d: NUMA %d, CPUs %v: want node %d and its 8 CPUs", i, g.NUMANode, g.CPUs, i/4)
		}
		if len(g.NVLinks) != 18 || activeLinks(g) != 18 || !g.NVLinks[17].ToSwitch || g.NVLinks[0].Version != 4 {
			t.Errorf("GPU %d: NVLinks %+v: want 18 active NVLink 4 links to NVSwitches", i, g.NVLinks)
		}
	}
	if h.GPUs[7].PCIBusID != "00000000:DB:00.0" {
		t.Errorf("GPU 7 bus %q", h.GPUs[7].PCIBusID)
	}
	rows := matrixString(h.Matrix)
	if len(rows) != 8 {
		t.Fatalf("matrix has %d rows, want 8", len(rows))
	}
	for i, row := range rows {
		cells := slices.Repeat([]string{"NV18"}, 8)
		cells[i] = "X"
		if want := strings.Join(cells, " "); row != want {
			t.Errorf("matrix row %d = %q, want %q", i, row, want)
		}
	}
	if !h.Matrix[0][5].P2P {
		t.Error("GPU 0 → 5: no P2P")
	}
	if len(h.Problems) != 0 {
		t.Errorf("problems %q: want none", h.Problems)
	}
	checkDGXHost(t, h)
}

// checkDGXHost checks the sysfs side of the DGX fixture.
func checkDGXHost(t *testing.T, h hostinfo.Host) {
	t.Helper()
	if c := h.CPU; c.Sockets != 2 || c.Cores != 8 || c.Threads != 16 || c.Model != "Intel(R) Xeon(R) Platinum 8480C" {
		t.Errorf("CPU = %+v: want 2 sockets, 8 cores, 16 threads", c)
	}
	var cores [][]int
	for c := range 8 {
		cores = append(cores, []int{c, c + 8})
	}
	if !slices.EqualFunc(h.CPU.Siblings, cores, slices.Equal) {
		t.Errorf("siblings %v: want each core's two threads, %v", h.CPU.Siblings, cores)
	}
	if len(h.NUMA) != 2 || !slices.Equal(h.NUMA[1].CPUs, []int{4, 5, 6, 7, 12, 13, 14, 15}) || h.NUMA[0].MemoryBytes != 1056439524<<10 {
		t.Errorf("NUMA = %+v", h.NUMA)
	}
	if h.Cgroup.CPUs != 8 || h.Cgroup.MemoryBytes != 512<<30 || len(h.Cgroup.CPUSet) != 16 {
		t.Errorf("cgroup = %+v: want 8 CPUs (the job's cpu.max), 512 GiB (the parent's memory.max), cpuset 0-15", h.Cgroup)
	}
	var names []string
	perNode := map[int]int{}
	for _, n := range h.NICs {
		names = append(names, n.Name)
		if n.Kind == "ib" {
			perNode[n.NUMANode]++
			if n.GbitPerS != 400 || !n.Up || !strings.HasPrefix(n.Device, "mlx5_") || n.Port != 1 {
				t.Errorf("NIC %+v: want an active 400 Gb/s IB port", n)
			}
		}
	}
	want := []string{"ibp0s0", "ibp1s0", "ibp2s0", "ibp3s0", "ibp4s0", "ibp5s0", "ibp6s0", "ibp7s0", "eno1"}
	if !slices.Equal(names, want) || perNode[0] != 4 || perNode[1] != 4 {
		t.Errorf("NICs %v (IB per node %v): want %v, 4 IB ports per node; lo, docker0, veth and bond skipped", names, perNode, want)
	}
}

func TestPCIeBox(t *testing.T) {
	h := detect(context.Background(), fixture(t, "pcie-4gpu.txtar"), pcie4().scan())
	if len(h.GPUs) != 4 {
		t.Fatalf("%d GPUs (%q): want 4", len(h.GPUs), h.GPUError)
	}
	want := []string{"X PIX SYS SYS", "PIX X SYS SYS", "SYS SYS X PIX", "SYS SYS PIX X"}
	if got := matrixString(h.Matrix); !slices.Equal(got, want) {
		t.Errorf("matrix %q, want %q", got, want)
	}
	if !h.Matrix[0][1].P2P || h.Matrix[1][2].P2P {
		t.Errorf("P2P 0→1 %v, 1→2 %v: want within a pair only", h.Matrix[0][1].P2P, h.Matrix[1][2].P2P)
	}
	for i, g := range h.GPUs {
		if g.NUMANode != i/2 || len(g.NVLinks) != 0 {
			t.Errorf("GPU %d: NUMA %d (want %d, from sysfs), NVLinks %v (want none)", i, g.NUMANode, i/2, g.NVLinks)
		}
	}
	if c := h.CPU; c.Sockets != 2 || c.Cores != 8 || c.Threads != 8 || len(c.Siblings) != 8 || !slices.Equal(c.Siblings[7], []int{7}) {
		t.Errorf("CPU = %+v: want 8 cores of one thread each", c)
	}
	if len(h.NICs) != 3 || h.NICs[0] != (hostinfo.NIC{Name: "ens1f0", Kind: "roce", Device: "mlx5_0", Port: 1, GbitPerS: 100, Up: true, NUMANode: 0}) ||
		h.NICs[2].Name != "eno2" || h.NICs[2].Up || h.NICs[2].GbitPerS != 0 {
		t.Errorf("NICs = %+v: want the two RoCE ports, then eno2 down", h.NICs)
	}
	if h.Cgroup.CPUs != 0 || h.Cgroup.MemoryBytes != 0 || h.Cgroup.CPUSet != nil {
		t.Errorf("cgroup = %+v: want no limits", h.Cgroup)
	}
	if len(h.Problems) != 0 {
		t.Errorf("problems %q", h.Problems)
	}
}

// TestProblems: MIG on, a link down and a lost GPU are each reported, and
// the lost GPU is left out rather than failing detection.
func TestProblems(t *testing.T) {
	f := dgxH100()
	f.gpus[3].mig = true
	f.gpus[6].links[5].up = false
	f.lost = map[int]bool{2: true}
	h := detect(context.Background(), fixture(t, "dgx-h100.txtar"), f.scan())
	if len(h.GPUs) != 7 {
		t.Errorf("%d GPUs: want the 7 NVML can open", len(h.GPUs))
	}
	all := strings.Join(h.Problems, "\n")
	for _, want := range []string{"GPU 2: NVML cannot open it (", "GPU 3 (00000000:5D:00.0): MIG is on", "GPU 6 (00000000:BA:00.0): 17 active NVLinks where another GPU has 18"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems:\n%s\nwant %q", all, want)
		}
	}
	if len(h.Problems) != 3 {
		t.Errorf("%d problems, want 3:\n%s", len(h.Problems), all)
	}
}

// TestInitFails: after a failed Init no other NVML call is made (the mock
// panics on any method left unset) and the host has no GPUs, with the reason.
func TestInitFails(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	g := scanNVML(context.Background(), fsys{root: t.TempDir()}, lib, func(string) bool { return true })
	if g.err == nil || !strings.Contains(g.err.Error(), "kernel module is not loaded") || len(g.gpus) != 0 {
		t.Errorf("gpuFacts = %+v: want no GPUs and why", g)
	}
}

// TestNoDriver runs the real go-nvml with a library path that cannot be
// loaded, as on a host without the driver: Init fails without a panic and
// the host reports 0 GPUs and why. (TestLocal does the same with the real
// path on a machine without the driver.)
func TestNoDriver(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath(t.TempDir() + "/libnvidia-ml.so.1"))
	scan := func(ctx context.Context, f fsys) gpuFacts {
		return scanNVML(ctx, f, lib, func(string) bool { return false })
	}
	h := detect(context.Background(), fixture(t, "pcie-4gpu.txtar"), scan)
	if len(h.GPUs) != 0 || h.GPUs == nil || !strings.Contains(h.GPUError, "no NVIDIA driver: libnvidia-ml.so.1 cannot be loaded") {
		t.Errorf("GPUs %v, GPUError %q: want none (an empty list) and the reason", h.GPUs, h.GPUError)
	}
	if h.CPU.Threads != 8 {
		t.Errorf("CPU = %+v: the rest of the host is still detected", h.CPU)
	}
}

// TestWriteMatrix: the PCIe box's matrix as nvidia-smi topo -m prints it.
func TestWriteMatrix(t *testing.T) {
	h := detect(context.Background(), fixture(t, "pcie-4gpu.txtar"), pcie4().scan())
	var b strings.Builder
	if err := WriteMatrix(&b, h); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	want := []string{
		"\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity",
		"GPU0\t X\t PIX\t SYS\t SYS\t0-3\t\t0",
		"GPU3\t SYS\t SYS\t PIX\t X\t4-7\t\t1",
	}
	if len(lines) < 5 || lines[0] != want[0] || lines[1] != want[1] || lines[4] != want[2] || !strings.Contains(b.String(), "NV#  = Connection traversing a bonded set of # NVLinks") {
		t.Errorf("matrix:\n%s\nwant lines\n%s", b.String(), strings.Join(want, "\n"))
	}
	b.Reset()
	if err := Describe(&b, h, "  "); err != nil || !strings.Contains(b.String(), "  gpu 2: NVIDIA L40S, 45.0 GiB, PCIe, numa 1\n") ||
		!strings.Contains(b.String(), "  nic ens1f0: roce mlx5_0, up, 100 Gb/s, numa 0\n") {
		t.Errorf("Describe:\n%s", b.String())
	}
}
