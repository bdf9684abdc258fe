//go:build linux && cgo

package detect

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// matrix is the GPU×GPU matrix of `nvidia-smi topo -m`. Two GPUs joined by
// NVLink are NV# with # the links between them: the direct links from one
// to the other, or, through NVSwitches, the fewer of the two GPUs' switch
// links (every switch link reaches every GPU; nvidia-smi shows NV18 for
// each pair of a DGX H100). Otherwise the PCIe path from NVML's
// GetTopologyCommonAncestor: PIX, PXB, PHB, NODE or SYS.
func matrix(gpus []hostinfo.GPU, devs []nvml.Device) [][]hostinfo.Link {
	if len(gpus) == 0 {
		return nil
	}
	m := make([][]hostinfo.Link, len(gpus))
	for i := range gpus {
		m[i] = make([]hostinfo.Link, len(gpus))
		for j := range gpus {
			if i == j {
				m[i][j] = hostinfo.Link{Kind: hostinfo.Self}
				continue
			}
			m[i][j] = cell(gpus[i], gpus[j], devs[i], devs[j])
		}
	}
	return m
}

// cell is the connection of GPUs a and b.
func cell(a, b hostinfo.GPU, da, db nvml.Device) hostinfo.Link {
	l := hostinfo.Link{Kind: hostinfo.SYS, P2P: p2p(da, db)}
	if nv := nvLinksBetween(a, b); nv > 0 {
		l.Kind, l.NVLinks = hostinfo.NVLinkKind, nv
		return l
	}
	if lvl, ret := da.GetTopologyCommonAncestor(db); ret == nvml.SUCCESS {
		l.Kind = pcieKind(lvl)
	}
	return l
}

// nvLinksBetween counts the active NVLinks joining a and b.
func nvLinksBetween(a, b hostinfo.GPU) int {
	direct, switchA, switchB := 0, 0, 0
	for _, l := range a.NVLinks {
		switch {
		case !l.Active:
		case l.ToSwitch:
			switchA++
		case l.RemoteBus == b.PCIBusID:
			direct++
		}
	}
	for _, l := range b.NVLinks {
		if l.Active && l.ToSwitch {
			switchB++
		}
	}
	return direct + min(switchA, switchB)
}

// pcieKind maps NVML's common-ancestor level to nvidia-smi's category.
func pcieKind(lvl nvml.GpuTopologyLevel) hostinfo.LinkKind {
	switch lvl {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE:
		return hostinfo.PIX // INTERNAL: two GPUs of one board, behind its own switch
	case nvml.TOPOLOGY_MULTIPLE:
		return hostinfo.PXB
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return hostinfo.PHB
	case nvml.TOPOLOGY_NODE:
		return hostinfo.NODE
	}
	return hostinfo.SYS
}

// p2p reports whether CUDA peer-to-peer reads and writes work from da to db.
func p2p(da, db nvml.Device) bool {
	for _, c := range []nvml.GpuP2PCapsIndex{nvml.P2P_CAPS_INDEX_READ, nvml.P2P_CAPS_INDEX_WRITE} {
		if s, ret := da.GetP2PStatus(db, c); ret != nvml.SUCCESS || s != nvml.P2P_STATUS_OK {
			return false
		}
	}
	return true
}
