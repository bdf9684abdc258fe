//go:build linux && cgo

package detect

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/rogpeppe/go-internal/txtar"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// fakeGPU is one GPU a mock NVML describes.
type fakeGPU struct {
	name, bus string
	memory    uint64
	numa      int // nvmlDeviceGetNumaNodeId's answer
	cpus      []int
	mig       bool
	links     []fakeLink // nil: no NVLink (NOT_SUPPORTED)
}

// fakeLink is one NVLink; remote is a PCI bus id.
type fakeLink struct {
	up       bool
	remote   string
	toSwitch bool
}

// fakeNVML is a mock NVML host: its GPUs, the PCIe level between each pair
// and which pairs have P2P, and the symbols the "library" has.
type fakeNVML struct {
	gpus     []fakeGPU
	ancestor func(i, j int) nvml.GpuTopologyLevel
	p2p      func(i, j int) bool
	lost     map[int]bool // DeviceGetHandleByIndex fails
	symbols  map[string]bool
}

// lib builds the mock library: go-nvml's moq mocks panic on any method
// the test did not set, so a call detection must not make fails the test.
func (f *fakeNVML) lib() *mock.Interface {
	devs := make([]*mock.Device, len(f.gpus))
	index := map[nvml.Device]int{}
	for i := range f.gpus {
		devs[i] = f.device(i, index)
		index[devs[i]] = i
	}
	return &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 12040, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (nvml.Device, nvml.Return) {
			if f.lost[n] {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return devs[n], nvml.SUCCESS
		},
	}
}

func (f *fakeNVML) device(i int, index map[nvml.Device]int) *mock.Device {
	g := f.gpus[i]
	link := func(l int) (fakeLink, nvml.Return) {
		if l >= len(g.links) {
			return fakeLink{}, nvml.ERROR_NOT_SUPPORTED
		}
		return g.links[l], nvml.SUCCESS
	}
	return &mock.Device{
		GetNameFunc:                  func() (string, nvml.Return) { return g.name, nvml.SUCCESS },
		GetUUIDFunc:                  func() (string, nvml.Return) { return "GPU-" + g.bus, nvml.SUCCESS },
		GetPciInfoFunc:               func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.bus), nvml.SUCCESS },
		GetMemoryInfoFunc:            func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: g.memory}, nvml.SUCCESS },
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS },
		GetMigModeFunc: func() (int, int, nvml.Return) {
			if g.mig {
				return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
			}
			return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
		},
		GetCpuAffinityFunc: func(words int) ([]uint, nvml.Return) {
			mask := make([]uint, words)
			for _, c := range g.cpus {
				mask[c/64] |= 1 << (c % 64)
			}
			return mask, nvml.SUCCESS
		},
		GetNumaNodeIdFunc: func() (int, nvml.Return) { return g.numa, nvml.SUCCESS },
		GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
			fl, ret := link(l)
			if fl.up {
				return nvml.FEATURE_ENABLED, ret
			}
			return nvml.FEATURE_DISABLED, ret
		},
		GetNvLinkVersionFunc: func(l int) (uint32, nvml.Return) { _, ret := link(l); return 4, ret },
		GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) {
			fl, ret := link(l)
			return pciInfo(fl.remote), ret
		},
		GetNvLinkRemoteDeviceTypeFunc: func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if fl, ret := link(l); fl.toSwitch || ret != nvml.SUCCESS {
				return nvml.NVLINK_DEVICE_TYPE_SWITCH, ret
			}
			return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
		},
		GetTopologyCommonAncestorFunc: func(d nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return f.ancestor(i, index[d]), nvml.SUCCESS
		},
		GetP2PStatusFunc: func(d nvml.Device, _ nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			if f.p2p(i, index[d]) {
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		},
	}
}

func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(bus) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

// scan is detection's GPU scan over the mock.
func (f *fakeNVML) scan() gpuScan {
	return func(ctx context.Context, fs fsys) gpuFacts {
		return scanNVML(ctx, fs, f.lib(), func(s string) bool { return f.symbols[s] })
	}
}

// fixture extracts testdata/name into a temporary root.
func fixture(t *testing.T, name string) fsys {
	t.Helper()
	ar, err := txtar.ParseFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if len(ar.Files) == 0 {
		t.Fatalf("%s: no files", name)
	}
	if err := txtar.Write(ar, root); err != nil {
		t.Fatal(err)
	}
	return fsys{root: root}
}

// rangeOf is lo..hi.
func rangeOf(lo, hi int) []int {
	var out []int
	for i := lo; i <= hi; i++ {
		out = append(out, i)
	}
	return out
}

// dgxH100 is 8 H100s, each with 18 NVLink 4 links to the NVSwitches, GPUs
// 0-3 on NUMA node 0 and 4-7 on node 1 (CPUs as in testdata/dgx-h100.txtar).
func dgxH100() *fakeNVML {
	f := &fakeNVML{symbols: map[string]bool{"nvmlDeviceGetNumaNodeId": true, "nvmlDeviceGetNvLinkRemoteDeviceType": true}}
	buses := []string{"18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"}
	for i, b := range buses {
		g := fakeGPU{name: "NVIDIA H100 80GB HBM3", bus: "00000000:" + b + ":00.0", memory: 81559 << 20, numa: i / 4}
		g.cpus = append(rangeOf(4*(i/4), 4*(i/4)+3), rangeOf(8+4*(i/4), 8+4*(i/4)+3)...)
		for l := 0; l < 18; l++ {
			g.links = append(g.links, fakeLink{up: true, remote: "00000000:0" + string(rune('5'+l%4)) + ":00.0", toSwitch: true})
		}
		f.gpus = append(f.gpus, g)
	}
	f.ancestor = func(i, j int) nvml.GpuTopologyLevel {
		if i/4 == j/4 {
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	f.p2p = func(i, j int) bool { return true }
	return f
}

// pcie4 is 4 GPUs without NVLink, two per socket behind one PCIe switch:
// PIX within a pair, SYS across the sockets, P2P within a pair only. The
// library lacks the newer symbols: NUMA nodes come from sysfs and no
// remote device types are asked for.
func pcie4() *fakeNVML {
	f := &fakeNVML{symbols: map[string]bool{}}
	for i, b := range []string{"41", "42", "C1", "C2"} {
		f.gpus = append(f.gpus, fakeGPU{name: "NVIDIA L40S", bus: "00000000:" + b + ":00.0", memory: 46068 << 20, numa: 99,
			cpus: rangeOf(4*(i/2), 4*(i/2)+3)})
	}
	f.ancestor = func(i, j int) nvml.GpuTopologyLevel {
		if i/2 == j/2 {
			return nvml.TOPOLOGY_SINGLE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	f.p2p = func(i, j int) bool { return i/2 == j/2 }
	return f
}

// matrixString writes m as nvidia-smi's cells, row by row.
func matrixString(m [][]hostinfo.Link) []string {
	var rows []string
	for _, r := range m {
		s := ""
		for j, c := range r {
			if j > 0 {
				s += " "
			}
			s += cellText(c)
		}
		rows = append(rows, s)
	}
	return rows
}

func cellText(c hostinfo.Link) string { return c.String() }
