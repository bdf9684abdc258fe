package planner

import (
	"context"
	"os"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// topology resolves the cluster of r: exactly one of GPUs, Topology and
// Hostfile.
func (r Request) topology(ctx context.Context) (Topology, error) {
	sources := 0
	for _, set := range []bool{r.GPUs != 0, r.Topology != "", r.Hostfile != "", r.Detected != nil} {
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
	case r.Detected != nil:
		return *r.Detected, r.Detected.Validate()
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
// are GPUs ("slurm": the allocation's nodes and their GPUs or tasks). The
// planner's nodes are identical, so unequal slot counts are refused rather
// than guessed at.
func (r Request) hostfileShape(ctx context.Context) (nodes, gpn int, err error) {
	hosts, err := hostfiles.ReadHosts(ctx, r.Hostfile, os.Getenv)
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

// CPUSpeed is how fast one core of a host runs the built-in engine,
// measured on the engine's own kernels and transports: what CPUTopology
// turns into planner devices. Every figure is an achieved rate, not a data
// sheet's: Topology divides each by the efficiency the cost model applies
// to it, so that the model gives back the measured rate.
type CPUSpeed struct {
	// GEMMFLOPSPerCore is the float32 FLOP/s of one thread of the engine's
	// matrix multiply on a transformer layer's weight multiplies.
	GEMMFLOPSPerCore float64 `json:"gemm_flops_per_core"`
	// KernelBytesPerSecPerCore is the rate at which one thread of the
	// engine's memory-bound kernels (LayerNorm, GELU, bias and residual
	// adds and their gradients) gets through the bytes the cost model
	// charges for them (LayerKernelBytes). The engine's kernels are not
	// fused as Megatron-LM's are, so this is below the memory's bandwidth.
	KernelBytesPerSecPerCore float64 `json:"kernel_bytes_per_s_per_core"`
	// SHMBytesPerSec is the bus bandwidth of the engine's all-reduce over
	// shared memory between the ranks of a host; TCPBytesPerSec over TCP
	// (loopback: the engine's side of a link between hosts).
	SHMBytesPerSec float64 `json:"shm_bytes_per_s"`
	TCPBytesPerSec float64 `json:"tcp_bytes_per_s"`
}

// DefaultCPUSpeed is the project's 2-core AMD EPYC (Zen 5, AVX-512) machine,
// medians of quiet runs (docs/benchmarks.md, "3D layouts of the small
// preset"). GEMM and kernels: `go test -run TestMeasureCPU -v
// ./engine/train` (engine/train.MeasureCPU); links: the all-reduce bus
// bandwidth of `gtrain bench collectives --max-bytes 64M` from 1 MiB up,
// with --env GTRAIN_COMM_NO_SHM=1 for TCP.
var DefaultCPUSpeed = CPUSpeed{
	GEMMFLOPSPerCore:         250e9,
	KernelBytesPerSecPerCore: 8e9,
	SHMBytesPerSec:           12e9,
	TCPBytesPerSec:           1.6e9,
}

// cpuGEMMHalf is the engine's matrix multiply's saturation dimension (see
// GPU.GEMMHalf): its micro-kernel's tiles are 12×32 (AVX-512), so a
// dimension of 64, a head's width, still reaches 0.9–0.97 of the rate of a
// layer's multiplies (BenchmarkSgemm: 227 GFLOP/s for the scores of T =
// 256 against 235 for the projection, docs/benchmarks.md); 4 gives 0.94.
// A GPU's 128 would charge the attention three times its time.
const cpuGEMMHalf = 4

// networkBytesPerSec is the network assumed between hosts, 10 GbE: the
// engine's TCP reaches more than that on loopback, so the network bounds it.
const networkBytesPerSec = 10e9 / 8

// CPUTopology describes the ranks of a built-in-engine run as planner
// devices with DefaultCPUSpeed (see CPUSpeed.Topology).
func CPUTopology(ranksPerHost []int, memTotal int64, cpus int) Topology {
	return DefaultCPUSpeed.Topology(ranksPerHost, memTotal, cpus)
}

// Topology describes the ranks of a built-in-engine run as planner
// devices, ranksPerHost[i] being host i's ranks: each rank gets its host's
// memory divided by the host's ranks and the cores its threads run on
// (every host is assumed to be like this one, with memTotal bytes and cpus
// cores, and as fast as s). Hosts with unequal rank counts become one rank
// per "node", which charges every rank the network: conservative.
func (s CPUSpeed) Topology(ranksPerHost []int, memTotal int64, cpus int) Topology {
	world, per := 0, 0
	equal := true
	for _, k := range ranksPerHost {
		world += k
		equal = equal && (per == 0 || k == per)
		per = max(per, k)
	}
	per = max(per, 1)
	cores := rankCores(cpus, per)
	o := DefaultOptions()
	dev := GPU{Name: "cpu-rank", MemoryBytes: memTotal / int64(per),
		PeakFLOPS:         cores * s.GEMMFLOPSPerCore / o.Efficiency,
		MemoryBytesPerSec: cores * s.KernelBytesPerSecPerCore / memoryEfficiency, GEMMHalf: cpuGEMMHalf}
	dev.PeakFP32FLOPS = dev.PeakFLOPS
	top := Topology{Nodes: len(ranksPerHost), GPUsPerNode: per, GPU: dev,
		Intra: Link{Kind: "shm", GbitPerS: gbit(s.SHMBytesPerSec / o.CommEfficiency)},
		Inter: Link{Kind: "eth", GbitPerS: gbit(min(s.TCPBytesPerSec, networkBytesPerSec) / o.CommEfficiency)}}
	if !equal {
		top.Nodes, top.GPUsPerNode = world, 1
	}
	return top
}

// rankCores is the cores one of ranks ranks of a host with cpus cores
// computes on. The engine gives each rank max(1, cpus/ranks) threads
// (Spec.threads); with more ranks than cores they share the cores in time,
// so each gets cpus/ranks of one.
func rankCores(cpus, ranks int) float64 {
	cpus, ranks = max(cpus, 1), max(ranks, 1)
	return min(float64(max(1, cpus/ranks)), float64(cpus)/float64(ranks))
}

// gbit is bytes/s in Gb/s, as links are given.
func gbit(bytesPerSec float64) float64 { return bytesPerSec * 8 / 1e9 }

// LayerKernelBytes is the memory-bound traffic the cost model charges one
// transformer layer of m for a forward and a backward pass of b sequences
// on one rank (no TP), activations stored as act says, without the
// attention scores' share (the attention kernel's, which fuses them with
// its multiplies). Dividing it by the time the engine's own kernels take
// for that work gives CPUSpeed.KernelBytesPerSecPerCore.
func LayerKernelBytes(m Model, b int, act ActStorage) float64 {
	x := newActShape(m, b, 1, false, FP32, act)
	x.a = 0 // no scores
	tr := x.layerTraffic(m)
	return tr.fwd + tr.bwd
}
