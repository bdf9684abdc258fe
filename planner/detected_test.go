package planner

import (
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// dgxHost is a DGX H100 as launch/detect describes it (its testdata
// dgx-h100.txtar with the mock NVML of its tests): 8 H100s with 18 active
// NVLink 4 links each to the NVSwitches, 8 InfiniBand ports at 400 Gb/s and
// a 25 GbE management port.
func dgxHost(name string) hostinfo.Host {
	h := hostinfo.Host{Name: name}
	for i := range 8 {
		g := hostinfo.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 << 20, ComputeMajor: 9}
		for l := range 18 {
			g.NVLinks = append(g.NVLinks, hostinfo.NVLink{Link: l, Active: true, Version: 4, ToSwitch: true})
		}
		h.GPUs = append(h.GPUs, g)
		h.NICs = append(h.NICs, hostinfo.NIC{Name: "ibp" + string(rune('0'+i)) + "s0", Kind: "ib", GbitPerS: 400, Up: true, NUMANode: i / 4})
	}
	h.NICs = append(h.NICs, hostinfo.NIC{Name: "eno1", Kind: "eth", GbitPerS: 25, Up: true})
	return h
}

// pcieHost is the 4-GPU PCIe box of launch/detect's tests: 4 L40S without
// NVLink, two 100 Gb/s RoCE ports and a management port that is down.
func pcieHost(name string) hostinfo.Host {
	h := hostinfo.Host{Name: name}
	for i := range 4 {
		h.GPUs = append(h.GPUs, hostinfo.GPU{Index: i, Name: "NVIDIA L40S", MemoryBytes: 46068 << 20, ComputeMajor: 8, ComputeMinor: 9})
	}
	h.NICs = []hostinfo.NIC{{Name: "ens1f0", Kind: "roce", GbitPerS: 100, Up: true}, {Name: "ens2f0", Kind: "roce", GbitPerS: 100, Up: true}, {Name: "eno2", Kind: "eth"}}
	return h
}

func TestTopologyOfDGX(t *testing.T) {
	top, warns, err := TopologyOf([]hostinfo.Host{dgxHost("dgx-0"), dgxHost("dgx-1")})
	if err != nil || len(warns) != 0 {
		t.Fatalf("TopologyOf: %v, warnings %q", err, warns)
	}
	want := Topology{Nodes: 2, GPUsPerNode: 8, GPU: Catalog["H100"].GPU,
		Intra: Link{Kind: "nvswitch", Count: 18, GbitPerS: 200}, Inter: Link{Kind: "ib", Count: 8, GbitPerS: 400}}
	if top != want {
		t.Errorf("topology %+v\nwant     %+v", top, want)
	}
	if top.Intra != Catalog["H100"].Intra || top.Inter != Catalog["H100"].Inter {
		t.Errorf("links %v, %v: want the catalog's DGX H100 links", top.Intra, top.Inter)
	}
	best := bestOf(t, top, "llama2-7b", 512)
	if best.World() != 16 {
		t.Errorf("best %+v: want all 16 GPUs", best.Layout)
	}
	// The plan is the one the catalog's two DGX H100 give: detection
	// changes nothing on a standard system.
	if cat := bestOf(t, Topology{Nodes: 2, GPUsPerNode: 8, GPU: Catalog["H100"].GPU, Intra: Catalog["H100"].Intra, Inter: Catalog["H100"].Inter}, "llama2-7b", 512); cat.Layout != best.Layout {
		t.Errorf("best %+v, the catalog's %+v", best.Layout, cat.Layout)
	}
}

func TestTopologyOfPCIe(t *testing.T) {
	top, warns, err := TopologyOf([]hostinfo.Host{pcieHost("box")})
	if err != nil || len(warns) != 0 {
		t.Fatalf("TopologyOf: %v, warnings %q", err, warns)
	}
	want := Topology{Nodes: 1, GPUsPerNode: 4, GPU: Catalog["L40S"].GPU, Intra: Link{Kind: "pcie4", GbitPerS: 256}, Inter: Link{Kind: "none"}}
	if top != want {
		t.Errorf("topology %+v\nwant     %+v", top, want)
	}
	best := bestOf(t, top, "llama2-7b", 16)
	if best.World() != 4 {
		t.Errorf("best %+v: want all 4 GPUs", best.Layout)
	}
	// The detected PCIe link is what the plan is made for: the same box
	// with NVSwitch would step faster.
	fast := top
	fast.Intra = Catalog["H100"].Intra
	if f := bestOf(t, fast, "llama2-7b", 16); !(best.StepTime > f.StepTime) {
		t.Errorf("PCIe step %.3gs, NVSwitch %.3gs: want PCIe slower", best.StepTime, f.StepTime)
	}
	// Two boxes: the two RoCE ports each.
	top, _, err = TopologyOf([]hostinfo.Host{pcieHost("a"), pcieHost("b")})
	if err != nil || top.Inter != (Link{Kind: "roce", Count: 2, GbitPerS: 100}) {
		t.Errorf("two boxes: inter %v, %v: want roce 2x100", top.Inter, err)
	}
}

// bestOf is Search's best layout for preset on top.
func bestOf(t *testing.T, top Topology, preset string, batch int) Candidate {
	t.Helper()
	p := Presets[preset]
	res, err := Search(Problem{Model: p.Model, Topology: top, GlobalBatch: batch, Precision: BF16, Options: DefaultOptions()}, Space{})
	if err != nil {
		t.Fatal(err)
	}
	best, ok := res.Best()
	if !ok {
		t.Fatalf("%s on %+v: no feasible layout", preset, top)
	}
	return best
}

func TestTopologyOfUnequal(t *testing.T) {
	weak := dgxHost("dgx-weak")
	weak.GPUs[3].NVLinks[0].Active = false
	weak.NICs[7].Up = false
	top, warns, err := TopologyOf([]hostinfo.Host{dgxHost("dgx-0"), weak})
	if err != nil {
		t.Fatal(err)
	}
	if top.Intra.Count != 17 || top.Inter.Count != 7 {
		t.Errorf("intra %v, inter %v: want the weaker host's 17 links and 7 NICs", top.Intra, top.Inter)
	}
	all := strings.Join(warns, "\n")
	if len(warns) != 2 || !strings.Contains(all, "hosts differ in GPU link: planning every node as dgx-weak") || !strings.Contains(all, "hosts differ in network") {
		t.Errorf("warnings:\n%s\nwant one for the GPU link and one for the network", all)
	}

	a100 := func(name string, gb int64) hostinfo.Host {
		h := dgxHost(name)
		for i := range h.GPUs {
			h.GPUs[i].Name, h.GPUs[i].MemoryBytes = "NVIDIA A100-SXM4-"+map[int64]string{40: "40GB", 80: "80GB"}[gb], gb<<30
		}
		return h
	}
	top, warns, err = TopologyOf([]hostinfo.Host{a100("big", 80), a100("small", 40)})
	if err != nil || top.GPU.Name != "A100-40GB" || len(warns) != 1 || !strings.Contains(warns[0], "planning every node as small (A100-40GB) rather than A100-80GB") {
		t.Errorf("A100 80+40: gpu %s, %v, warnings %q: want A100-40GB with a warning", top.GPU.Name, err, warns)
	}

	for name, hosts := range map[string][]hostinfo.Host{
		"GPU counts":              {dgxHost("dgx-0"), pcieHost("box")},
		"GPUs on some hosts only": {pcieHost("box"), {Name: "cpu-host", NUMA: []hostinfo.NUMANode{{MemoryBytes: 1 << 30}}}},
		"unknown GPU":             {{Name: "odd", GPUs: []hostinfo.GPU{{Name: "NVIDIA GeForce GTX 1080", MemoryBytes: 8 << 30}}}},
		"no hosts":                nil,
	} {
		if _, _, err := TopologyOf(hosts); err == nil || !strings.HasPrefix(err.Error(), "planner: ") {
			t.Errorf("%s: err %v: want a refusal", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestTopologyOfCPU: hosts without GPUs are the built-in engine's ranks,
// one per NUMA node, with the smallest host's memory and cores (its cgroup
// counted).
func TestTopologyOfCPU(t *testing.T) {
	host := func(name string, cpus int, mem int64) hostinfo.Host {
		return hostinfo.Host{Name: name, CPU: hostinfo.CPU{Threads: cpus},
			NUMA: []hostinfo.NUMANode{{ID: 0, MemoryBytes: mem / 2}, {ID: 1, MemoryBytes: mem / 2}}}
	}
	small := host("small", 16, 64<<30)
	small.Cgroup = hostinfo.Cgroup{CPUs: 8, MemoryBytes: 32 << 30}
	top, warns, err := TopologyOf([]hostinfo.Host{host("big", 32, 128<<30), small})
	if err != nil {
		t.Fatal(err)
	}
	if want := CPUTopology([]int{2, 2}, 32<<30, 8); top != want {
		t.Errorf("topology %+v\nwant     %+v", top, want)
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "32.0 GiB and 8 CPUs") {
		t.Errorf("warnings %q", warns)
	}
}
