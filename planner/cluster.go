package planner

import (
	"context"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// topology resolves the cluster of r: exactly one of GPUs, Topology and
// Hostfile.
func (r Request) topology(ctx context.Context) (Topology, error) {
	sources := 0
	for _, set := range []bool{r.GPUs != 0, r.Topology != "", r.Hostfile != ""} {
		if set {
			sources++
		}
	}
	switch {
	case sources == 0:
		return Topology{}, usage.Errorf("plan: no cluster: give --gpus N (with --gpus-per-node, --gpu), --topology FILE or --hostfile FILE")
	case sources > 1:
		return Topology{}, usage.Errorf("plan: --gpus, --topology and --hostfile each describe the cluster: give one")
	case r.Topology != "":
		return r.topologyFile(ctx)
	}
	nodes, gpn := 0, r.GPUsPerNode
	if r.Hostfile != "" {
		var err error
		if nodes, gpn, err = r.hostfileShape(ctx); err != nil {
			return Topology{}, err
		}
	} else {
		if r.GPUs < 1 || gpn < 1 {
			return Topology{}, usage.Errorf("plan: --gpus %d, --gpus-per-node %d: each must be at least 1", r.GPUs, gpn)
		}
		gpn = min(gpn, r.GPUs)
		if r.GPUs%gpn != 0 {
			return Topology{}, usage.Errorf("plan: --gpus %d is not a multiple of --gpus-per-node %d: the planner needs whole, equal nodes", r.GPUs, gpn)
		}
		nodes = r.GPUs / gpn
	}
	return r.catalogTopology(nodes, gpn)
}

// catalogTopology is nodes × gpn of r.GPU, with r.Intra and r.Inter.
func (r Request) catalogTopology(nodes, gpn int) (Topology, error) {
	e, err := LookupGPU(r.GPU)
	if err != nil {
		return Topology{}, usage.Errorf("plan: --gpu: %v", err)
	}
	top := Topology{Nodes: nodes, GPUsPerNode: gpn, GPU: e.GPU, Intra: e.Intra, Inter: e.Inter}
	for _, l := range []struct {
		flag, val string
		dst       *Link
	}{{"intra", r.Intra, &top.Intra}, {"inter", r.Inter, &top.Inter}} {
		if l.val == "" {
			continue
		}
		if *l.dst, err = ParseLink(l.val); err != nil {
			return top, usage.Errorf("plan: --%s: %v", l.flag, err)
		}
	}
	if nodes == 1 && r.Inter == "" {
		top.Inter = Link{Kind: "none"}
	}
	return top, nil
}

// topologyFile reads r.Topology, bounded (userfile.ConfigLimit) and
// stopping with ctx; the per-GPU and link flags then conflict.
func (r Request) topologyFile(ctx context.Context) (Topology, error) {
	for _, f := range []string{"gpu", "gpus-per-node", "intra", "inter"} {
		if r.Changed != nil && r.Changed(f) {
			return Topology{}, usage.Errorf("plan: --%s and --topology both describe the cluster: edit the file or drop --topology", f)
		}
	}
	data, err := userfile.Read(ctx, r.Topology, userfile.ConfigLimit)
	if err != nil {
		return Topology{}, userfile.Prefix(ctx, "plan: --topology", err)
	}
	top, err := ParseTopology(data)
	if err != nil {
		return top, usage.Errorf("plan: --topology %s: %v", r.Topology, err)
	}
	return top, nil
}

// hostfileShape is the nodes and GPUs per node of r.Hostfile, whose slots
// are GPUs. The planner's nodes are identical, so unequal slot counts are
// refused rather than guessed at.
func (r Request) hostfileShape(ctx context.Context) (nodes, gpn int, err error) {
	hosts, err := hostfiles.ReadFile(ctx, r.Hostfile)
	if err != nil {
		return 0, 0, err
	}
	return shapeOf(r.Hostfile, hosts)
}

// shapeOf is the nodes and GPUs per node of the hosts of hostfile path.
func shapeOf(path string, hosts []hostfiles.Host) (nodes, gpn int, err error) {
	if len(hosts) == 0 { // hostfiles.ReadFile refuses an empty hostfile
		return 0, 0, usage.Errorf("plan: --hostfile %s: no hosts", path)
	}
	for _, h := range hosts {
		if h.Slots != hosts[0].Slots {
			return 0, 0, usage.Errorf("plan: --hostfile %s: %s has %d slots and %s %d: the planner needs the same GPUs on every node; plan with --gpus N --gpus-per-node G instead",
				path, hosts[0].Name, hosts[0].Slots, h.Name, h.Slots)
		}
	}
	return len(hosts), hosts[0].Slots, nil
}

// Nominal figures for a CPU rank of the built-in engine: its "device" is
// its share of the host. The FLOP/s only scale the predicted step time (the
// engine's float32 GEMM reaches about this per core with AVX2/AVX-512,
// docs/benchmarks.md); memory decides what fits.
const (
	cpuFLOPSPerCore = 50e9
	shmGbitPerS     = 80 // shared-memory rings between ranks of a host, ~10 GB/s
	tcpGbitPerS     = 10 // between hosts: a plain 10 GbE network is assumed
)

// CPUTopology describes the ranks of a built-in-engine run as planner
// devices, ranksPerHost[i] being host i's ranks: each rank gets its host's
// memory and cores divided by the host's ranks (every host is assumed to
// be like this one, with memTotal bytes and cpus cores). Hosts with unequal
// rank counts become one rank per "node", which charges every rank the
// network: conservative.
func CPUTopology(ranksPerHost []int, memTotal int64, cpus int) Topology {
	world, per := 0, 0
	equal := true
	for _, k := range ranksPerHost {
		world += k
		equal = equal && (per == 0 || k == per)
		per = max(per, k)
	}
	per = max(per, 1)
	dev := GPU{Name: "cpu-rank", MemoryBytes: memTotal / int64(per),
		PeakFLOPS: float64(max(cpus/per, 1)) * cpuFLOPSPerCore}
	dev.PeakFP32FLOPS = dev.PeakFLOPS
	top := Topology{Nodes: len(ranksPerHost), GPUsPerNode: per, GPU: dev,
		Intra: Link{Kind: "shm", GbitPerS: shmGbitPerS}, Inter: Link{Kind: "eth", GbitPerS: tcpGbitPerS}}
	if !equal {
		top.Nodes, top.GPUsPerNode = world, 1
	}
	return top
}
