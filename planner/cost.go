package planner

import "math"

// ModelFLOPs is the FLOPs of one training step of batch sequences without
// recomputation: 3 × the forward pass (backward = 2 × forward), the forward
// being 2 FLOPs per matrix weight per token, 4·s·h per token per layer for
// the attention scores and their product with V, and 2·h·V per token for the
// output layer. For GPT shapes this is Narayanan et al. 2021, eq. (3) with
// 72 in place of 96:
//
//	72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
func ModelFLOPs(m Model, batch int) float64 {
	b, s, h := float64(batch), float64(m.Seq), float64(m.Hidden)
	return 3 * (float64(m.Layers)*layerForward(m, b) + 2*b*s*h*float64(m.Vocab))
}

// HardwareFLOPs is ModelFLOPs plus what recomputation adds: a full recompute
// runs every layer's forward again (Narayanan et al.: 96·B·s·l·h²·(1 +
// s/(6h) + V/(16·l·h))); a selective one the attention core, counted as
// Korthikanti et al. 2022 count it (72·B·s·l·h²·s/(6h), 2.7% for GPT-3).
func HardwareFLOPs(m Model, batch int, rc Recompute) float64 {
	return ModelFLOPs(m, batch) + float64(m.Layers)*recomputeForward(m, float64(batch), rc)
}

// layerForward is one layer's forward FLOPs for b sequences.
func layerForward(m Model, b float64) float64 {
	s, h := float64(m.Seq), float64(m.Hidden)
	return 2*b*s*m.MatrixParams() + 4*b*s*s*h
}

// recomputeForward is the extra FLOPs per layer a recomputation mode costs.
func recomputeForward(m Model, b float64, rc Recompute) float64 {
	switch rc {
	case RecomputeFull:
		return layerForward(m, b)
	case RecomputeSelective:
		s, h := float64(m.Seq), float64(m.Hidden)
		return 12 * b * s * s * h
	}
	return 0
}

// Options are the cost model's calibration.
type Options struct {
	// Efficiency is the fraction of peak FLOP/s large matrix multiplies
	// reach (the plateau: small ones reach less, see gemm.efficiency).
	Efficiency float64
	// CommEfficiency is the fraction of a link's rate collectives reach
	// (NCCL bus bandwidth over the nominal rate).
	CommEfficiency float64
	// UsableMemory is the fraction of device memory tensors may fill; the
	// rest is the CUDA context, the allocator's fragmentation and workspace.
	UsableMemory float64
	// SequenceParallel shards the TP-replicated activations (Korthikanti et
	// al. 2022) whenever TP > 1.
	SequenceParallel bool
	// Activations is how the trained framework keeps activations; the
	// zero value is Megatron-LM's, which the defaults are calibrated on.
	Activations ActStorage
	// States is how it keeps working weights and gradients; the zero
	// value is the ZeRO paper's.
	States StateStorage
}

// DefaultOptions are calibrated on Narayanan et al. 2021, Table 1 (see
// docs/planner.md): their A100 runs reach 43–52% of peak including
// memory-bound kernels, bubbles and communication.
func DefaultOptions() Options {
	return Options{Efficiency: 0.8, CommEfficiency: 0.8, UsableMemory: 0.9, SequenceParallel: true}
}

// Latencies per collective step, a few microseconds as NCCL measures them.
const (
	latIntra = 5e-6
	latInter = 10e-6
)

// net is the bandwidth picture of one layout on one topology.
type net struct {
	intra, interGPU float64 // bytes/s per GPU: the node link, a GPU's share of its node's network
	gpn             int
}

func newNet(top Topology, o Options) net {
	n := net{intra: top.Intra.BytesPerSec() * o.CommEfficiency, gpn: top.GPUsPerNode}
	// Every GPU of a node runs its collectives at once, so each gets its
	// share of the node's NICs.
	n.interGPU = top.Inter.BytesPerSec() * o.CommEfficiency / float64(top.GPUsPerNode)
	if n.intra <= 0 {
		n.intra = math.Inf(1)
	}
	if n.interGPU <= 0 {
		n.interGPU = math.Inf(1)
	}
	return n
}

// allReduce is the time of a ring all-reduce of bytes over n ranks, k of
// them per node (hierarchical: reduce-scatter in the node, all-reduce of
// 1/k across nodes, all-gather in the node). Reduce-scatter and all-gather
// alone cost half (pass factor 1 instead of 2).
func (nt net) allReduce(bytes float64, n, k int, factor float64) float64 {
	if n <= 1 {
		return 0
	}
	k = max(1, min(k, n))
	nodes := n / k
	var t float64
	if k > 1 {
		kf := float64(k)
		t += factor*(kf-1)/kf*bytes/nt.intra + factor*(kf-1)*latIntra
	}
	if nodes > 1 {
		nf := float64(nodes)
		t += factor*(nf-1)/nf*bytes/float64(k)/nt.interGPU + factor*(nf-1)*latInter
	}
	return t
}

// sat is the saturation x/(x+x0): GEMMs with a small dimension run below
// the plateau efficiency.
func sat(x, x0 float64) float64 { return x / (x + x0) }

// gemmEfficiency is the fraction of peak a layer's weight multiplies reach
// together with b sequences per micro-batch and TP degree t: their FLOPs
// over their time at each one's own rate (gemm.efficiency), for --explain.
func gemmEfficiency(eff, half float64, m Model, b, t int) float64 {
	gs := layerGEMMs(m, b, t)
	var flops float64
	for _, g := range gs {
		flops += g.flops()
	}
	return flops / gemmTime(eff, 1, half, gs...)
}
