package launch

import (
	"cmp"
	"context"
	"fmt"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// The counts --nproc-per-node takes besides a number, as torchrun.
const (
	NprocGPU  = "gpu"  // a rank per GPU of the host
	NprocAuto = "auto" // a rank per GPU, or per CPU on a host without GPUs
)

// CountSlots is the ranks --nproc-per-node from (gpu or auto) starts on
// host h: its GPUs, or under auto on a host without, the CPUs ranks may
// use there. torchrun's auto counts every CPU; gtrain keeps within the
// cgroup's cpuset and this process's affinity, as the binding does.
func CountSlots(h *hostinfo.Host, from string) (int, error) {
	n := len(h.GPUs)
	switch {
	case n > 0:
	case from == NprocGPU:
		return 0, usage.Errorf("launch: host %s: --nproc-per-node gpu: the host has no GPUs (%s): give a number of ranks, or auto for one per CPU",
			hostName(h), cmp.Or(h.GPUError, "none detected"))
	default:
		cpus := usableCPUs(h)
		if own := processAffinity(); len(own) > 0 {
			cpus = intersect(cpus, own)
		}
		n = len(cpus)
	}
	return min(max(n, 1), hostfiles.MaxSlotsPerHost), nil
}

// ResolveNproc counts the ranks of a run on this machine alone when
// --nproc-per-node said gpu or auto (detecting the machine); with a
// hostfile, its hosts' slots say how many, and Nodes counts those it
// lacks.
func (r *Request) ResolveNproc(ctx context.Context) error {
	if r.NprocFrom == "" || r.Hostfile != "" {
		return nil
	}
	n, err := CountSlots(DetectHost(ctx), r.NprocFrom)
	if err != nil {
		return err
	}
	r.NprocPerNode, r.NprocFrom = n, ""
	return nil
}

// readHostfile reads the hostfile; under --nproc-per-node gpu|auto a host
// written without slots gets as many as its hardware says, which the
// launcher can count before launch on this machine only.
func (r *Request) readHostfile(ctx context.Context) ([]hostfiles.Host, error) {
	if r.NprocFrom == "" {
		return hostfiles.ReadFile(ctx, r.Hostfile)
	}
	var local *hostinfo.Host
	return hostfiles.ReadFileSlots(ctx, r.Hostfile, func(h hostfiles.Host) (int, error) {
		if !IsLocalHost(h.Name) {
			return 0, fmt.Errorf("no slots= for %s: --nproc-per-node %s counts the hardware of this machine only before launch; add slots=N for each remote host", h.Name, r.NprocFrom)
		}
		if local == nil {
			local = DetectHost(ctx)
		}
		return CountSlots(local, r.NprocFrom)
	})
}
