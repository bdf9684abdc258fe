// Package detect turns a host's hardware into hostinfo.Host: its GPUs
// through NVML (github.com/NVIDIA/go-nvml, imported only here and only in
// a linux && cgo build, as it dlopens libnvidia-ml.so.1 through cgo), its
// CPUs, NUMA nodes, network interfaces and cgroup limits through sysfs and
// procfs. The agent runs it on each host (launch's join carries the
// result) and `gtrain hosts check` on this one.
//
// Detection does not fail: what cannot be read is unknown (empty, -1), and
// a host without an NVIDIA driver has no GPUs, with Host.GPUError saying
// why. Every file read is bounded.
package detect

import (
	"context"
	"os"
	"slices"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// Local detects this machine: NVML for its GPUs and the files below /.
func Local(ctx context.Context) hostinfo.Host {
	return detect(ctx, fsys{root: "/"}, localGPUs)
}

// gpuScan is how detect finds GPUs: NVML on this machine (localGPUs), a
// mock in tests.
type gpuScan func(ctx context.Context, f fsys) gpuFacts

// gpuFacts is what a GPU scan found; err says why GPUs is empty.
type gpuFacts struct {
	gpus         []hostinfo.GPU
	matrix       [][]hostinfo.Link
	driver, cuda string
	problems     []string
	err          error
}

// detect gathers the host's facts below f's root and its GPUs from scan.
func detect(ctx context.Context, f fsys, scan gpuScan) hostinfo.Host {
	h := hostinfo.Host{GPUs: []hostinfo.GPU{}}
	h.Name, _ = os.Hostname()
	h.CPU = f.cpus()
	h.NUMA = f.numa(h.CPU)
	h.NICs = f.nics()
	if h.NICs == nil {
		h.NICs = []hostinfo.NIC{}
	}
	var unseen []string
	h.Cgroup, unseen = f.cgroupLimits()
	if ctx.Err() != nil {
		h.GPUError = "detect: stopped: " + context.Cause(ctx).Error()
		return h
	}
	g := scan(ctx, f)
	if g.err != nil {
		h.GPUError = g.err.Error()
	} else if g.gpus != nil {
		h.GPUs = g.gpus
	}
	h.Matrix, h.Driver, h.CUDA = g.matrix, g.driver, g.cuda
	gpuNodesFromCPUs(&h)
	h.Problems = append(g.problems, problems(h)...)
	if len(unseen) > 0 {
		h.Problems = append(h.Problems, unseenProblem(unseen))
	}
	return h
}

// gpuNodesFromCPUs fills the NUMA node of each GPU whose node NVML and
// sysfs left unknown: the node holding the first CPU of its affinity.
func gpuNodesFromCPUs(h *hostinfo.Host) {
	for i, g := range h.GPUs {
		if g.NUMANode >= 0 || len(g.CPUs) == 0 {
			continue
		}
		for _, n := range h.NUMA {
			if slices.Contains(n.CPUs, g.CPUs[0]) {
				h.GPUs[i].NUMANode = n.ID
				break
			}
		}
	}
}
