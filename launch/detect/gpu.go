//go:build linux && cgo

package detect

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// readGPU reads one GPU's facts. A field NVML cannot give stays unknown;
// a GPU whose memory cannot be read is reported as a problem (NVML answers
// ERROR_GPU_IS_LOST for a GPU that fell off the bus).
func readGPU(f fsys, d nvml.Device, i int, has func(string) bool) (hostinfo.GPU, []string) {
	g := hostinfo.GPU{Index: i, NUMANode: -1, CPUs: []int{}}
	var bad []string
	g.Name, _ = d.GetName()
	g.UUID, _ = d.GetUUID()
	if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = busID(pci)
	}
	if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryBytes = int64(min(mem.Total, 1<<62))
	} else {
		bad = append(bad, fmt.Sprintf("GPU %d (%s): NVML cannot read its memory (%v): it may be lost or in a bad state; see nvidia-smi -i %d and dmesg for Xid errors", i, g.PCIBusID, ret, i))
	}
	if major, minor, ret := d.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.ComputeMajor, g.ComputeMinor = major, minor
	}
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
		g.MIG = cur == nvml.DEVICE_MIG_ENABLE
	}
	if set, ret := d.GetCpuAffinity(MaxCPU/64 + 1); ret == nvml.SUCCESS {
		g.CPUs = maskCPUs(set)
	}
	g.NUMANode = gpuNUMA(f, d, g.PCIBusID, has)
	g.NVLinks = nvLinks(d, has)
	return g, bad
}

// gpuNUMA is the GPU's NUMA node from NVML (drivers from 2023 on), else
// from its PCI device in sysfs; -1 when neither knows.
func gpuNUMA(f fsys, d nvml.Device, bus string, has func(string) bool) int {
	if has("nvmlDeviceGetNumaNodeId") {
		if n, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS && n >= 0 {
			return n
		}
	}
	if sys := sysfsBus(bus); sys != "" {
		return f.numaOf("sys/bus/pci/devices/" + sys)
	}
	return -1
}

// nvLinks reads each NVLink of d: NVML numbers them from 0 and answers
// NOT_SUPPORTED or INVALID_ARGUMENT past the GPU's last one (and for
// every link of a GPU without NVLink).
func nvLinks(d nvml.Device, has func(string) bool) []hostinfo.NVLink {
	var out []hostinfo.NVLink
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := d.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			continue
		}
		l := hostinfo.NVLink{Link: link, Active: state == nvml.FEATURE_ENABLED}
		if v, ret := d.GetNvLinkVersion(link); ret == nvml.SUCCESS {
			l.Version = int(v)
		}
		if pci, ret := d.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
			l.RemoteBus = busID(pci)
		}
		if has("nvmlDeviceGetNvLinkRemoteDeviceType") {
			if t, ret := d.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS {
				l.ToSwitch = t == nvml.NVLINK_DEVICE_TYPE_SWITCH
			}
		}
		out = append(out, l)
	}
	return out
}

// markSwitchLinks decides, for drivers without
// nvmlDeviceGetNvLinkRemoteDeviceType, which active links end at an
// NVSwitch: those whose remote end is no GPU of the host.
func markSwitchLinks(gpus []hostinfo.GPU, has func(string) bool) {
	if has("nvmlDeviceGetNvLinkRemoteDeviceType") {
		return
	}
	isGPU := map[string]bool{}
	for _, g := range gpus {
		isGPU[g.PCIBusID] = true
	}
	for i := range gpus {
		for k, l := range gpus[i].NVLinks {
			gpus[i].NVLinks[k].ToSwitch = l.Active && l.RemoteBus != "" && !isGPU[l.RemoteBus]
		}
	}
}

// busID is NVML's PCI bus id, "00000000:18:00.0", upper case as
// nvidia-smi prints it.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.ToUpper(string(b))
}

// sysfsBus turns NVML's 8-digit PCI domain into sysfs's 4:
// "00000000:18:00.0" → "0000:18:00.0"; "" when bus is not of that form.
func sysfsBus(bus string) string {
	dom, rest, ok := strings.Cut(bus, ":")
	// The result names a directory: nothing that could leave it.
	if !ok || len(dom) != 8 || strings.Contains(rest, "/") || strings.Contains(rest, "..") {
		return ""
	}
	return strings.ToLower(dom[4:] + ":" + rest)
}

// maskCPUs expands NVML's CPU affinity bitmask (64 CPUs per word) to ids.
func maskCPUs(words []uint) []int {
	cpus := []int{}
	for w, word := range words {
		for word != 0 {
			b := bits.TrailingZeros(word)
			cpus = append(cpus, w*bits.UintSize+b)
			word &^= 1 << b
		}
	}
	return cpus
}
