package planner

import "math"

// time fills the step time, throughput and communication of c:
//
//	step = m·T + (p−1)·T + exposed PP sends + exposed DP/ZeRO traffic + optimizer step
//
// where T is the slowest stage's time for one micro-batch (its compute:
// matrix multiplies and memory-bound kernels, plus its TP collectives,
// which Megatron-LM does not overlap) and (p−1)·T is the 1F1B pipeline
// bubble, (p−1)/m of the ideal time (Narayanan et al. 2021, section 2.2.1);
// with v virtual stages (the interleaved schedule) it is (p−1)·T/v,
// (p−1)/(v·m) of the ideal time (section 2.2.2).
func (ev *evaluation) time(c *Candidate) {
	l, pr := ev.l, ev.pr
	d := &c.Detail
	d.GEMMEfficiency = gemmEfficiency(pr.Options.Efficiency, gemmHalfOf(pr.Topology.GPU), pr.Model, l.MicroBatch, l.TP)
	var slowest, comp, mem, tp float64
	for _, st := range ev.stages[:ev.n] {
		f, mb := ev.stageCompute(st)
		t := ev.stageTP(st)
		if f+t > slowest {
			slowest, comp, mem, tp = f+t, f, mb, t
		}
	}
	m, p, v := float64(ev.m), float64(l.PP), float64(l.Chunks())
	d.Compute = m * slowest
	d.BubbleTime = (p - 1) * slowest / v
	d.MemoryBound = m * mem
	d.TPTime = m * tp
	c.CommBytes.TP = m * ev.tpBytes(ev.stages[0])
	ev.pipelineComm(c)
	ev.dataParallelComm(c, comp)
	d.Optimizer = ev.optimizerTime()
	c.StepTime = d.Compute + d.BubbleTime + d.PPExposed + d.DPExposed + d.Optimizer
	c.Bubble = (p - 1) / (v * m)
	d.ModelFLOPs = ModelFLOPs(pr.Model, pr.GlobalBatch)
	d.HardwareFLOPs = HardwareFLOPs(pr.Model, pr.GlobalBatch, l.Recompute)
	gpus := float64(l.World())
	c.TFLOPSPerGPU = d.HardwareFLOPs / (c.StepTime * gpus) / 1e12
	c.MFU = d.ModelFLOPs / (c.StepTime * gpus * pr.Topology.GPU.Peak(pr.Precision))
}

// passes counts, in forwards, what a micro-batch runs of a layer: its
// weight multiplies and its attention core (forward 1, backward 2, plus 1
// for the core under either recomputation and for the multiplies under a
// full one), and the forward of its memory-bound kernels (twice under a
// full recomputation; layerTraffic counts their backward).
func (ev *evaluation) passes() (weights, core, fwd float64) {
	switch ev.l.Recompute {
	case RecomputeFull:
		return 4, 4, 2
	case RecomputeSelective:
		return 3, 4, 1
	}
	return 3, 3, 1
}

// stageCompute is one GPU's compute time for one micro-batch on stage st,
// and the part of it in memory-bound kernels: its layers' weight
// multiplies, attention cores and memory-bound kernels, and on the last
// stage the output layer and the cross-entropy. The embedding lookup is
// left out (a fraction of one layer's element-wise work). A GPU without a
// memory bandwidth (a CPU rank) is charged its multiplies only.
func (ev *evaluation) stageCompute(st stage) (sec, memBound float64) {
	m, b, t := ev.pr.Model, ev.l.MicroBatch, ev.l.TP
	gpu, eff := ev.pr.Topology.GPU, ev.pr.Options.Efficiency
	peak, bw, half := gpu.Peak(ev.pr.Precision), gpu.MemoryBytesPerSec*memoryEfficiency, gemmHalfOf(gpu)
	weights, core, fwd := ev.passes()
	layers := float64(st.layers)
	sec = layers * (weights*gemmTime(eff, peak, half, layerGEMMs(m, b, t)...) + core*ev.coreTime(eff, peak, half, bw))
	last := st.index == ev.l.PP-1
	if last {
		sec += 3 * gemmTime(eff, peak, half, outputGEMM(m, b, t))
	}
	if bw <= 0 {
		return sec, 0
	}
	tr := ev.x.layerTraffic(m)
	bytes := layers * (fwd*tr.fwd + tr.bwd)
	if ev.l.Recompute == RecomputeSelective {
		bytes += layers * tr.core
	}
	if last {
		ht := ev.x.headTraffic(m.Vocab)
		bytes += ht.fwd + ht.bwd
	}
	return sec + bytes/bw, bytes / bw
}

// coreTime is one forward of the attention core's batched multiplies: the
// slower of their FLOPs at their rate and their traffic of the a·s² scores
// at the memory bandwidth (the scores written by Q·Kᵀ, the dropout's
// output read by the product with V; a roofline). Backward is twice both.
func (ev *evaluation) coreTime(eff, peak, half, bw float64) float64 {
	m, b, t := ev.pr.Model, ev.l.MicroBatch, ev.l.TP
	sec := gemmTime(eff, peak, half, attentionGEMMs(m, b, t)...)
	if bw > 0 {
		scores := ev.x.b * ev.x.a * ev.x.s * ev.x.s / ev.x.t
		sec = math.Max(sec, 2*ev.x.e*scores/bw)
	}
	return sec
}

// optimizerTime is the optimizer step after the gradients are reduced:
// memory-bound (optimizerBytes per parameter of the most loaded stage, the
// Adam part on a 1/dp shard under ZeRO), not overlapped with anything.
func (ev *evaluation) optimizerTime() float64 {
	bw := ev.pr.Topology.GPU.MemoryBytesPerSec * memoryEfficiency
	if bw <= 0 {
		return 0
	}
	psi := 0.0
	for _, st := range ev.stages[:ev.n] {
		psi = math.Max(psi, st.psi)
	}
	full, shard := optimizerBytes(ev.pr.Precision)
	if ev.l.ZeroStage >= 1 {
		shard /= float64(ev.l.DP)
	}
	return psi * (full + shard) / bw
}

// tpCollectives is the number of TP all-reduces (or all-gather +
// reduce-scatter pairs, with SP) per layer per micro-batch: two forward,
// two backward, two more when a full recompute reruns the forward.
func (ev *evaluation) tpCollectives() float64 {
	if ev.l.Recompute == RecomputeFull {
		return 6
	}
	return 4
}

// stageTP is the time of stage st's TP collectives for one micro-batch;
// TP groups sit inside a node.
func (ev *evaluation) stageTP(st stage) float64 {
	bytes := ev.x.e * ev.x.s * ev.x.b * ev.x.h
	return float64(st.layers) * ev.tpCollectives() * ev.net.allReduce(bytes, ev.l.TP, ev.l.TP, 2)
}

// tpBytes is what one GPU of stage st sends in TP collectives per micro-batch.
func (ev *evaluation) tpBytes(st stage) float64 {
	t := float64(ev.l.TP)
	bytes := ev.x.e * ev.x.s * ev.x.b * ev.x.h
	return float64(st.layers) * ev.tpCollectives() * 2 * (t - 1) / t * bytes
}

// pipelineComm is the point-to-point traffic between stages: each
// micro-batch's activations forward and gradients backward, s·b·h/t
// elements each with Megatron-LM's scatter/gather across the TP ranks.
// Neighbouring stages are TP ranks apart, so they share a node only when
// TP × PP fits in one. The 1F1B schedule waits for each of its m + p − 1
// slots' sends, so they count as exposed; the interleaved one sends v
// times as many messages, one per chunk, in m·v + p − 1 slots.
func (ev *evaluation) pipelineComm(c *Candidate) {
	l := ev.l
	if l.PP == 1 {
		return
	}
	msg := ev.x.e * ev.x.s * ev.x.b * ev.x.h / ev.x.t
	bw, lat := ev.net.intra, latIntra
	if c.Detail.PPInter = l.TP*l.PP > ev.net.gpn; c.Detail.PPInter {
		bw, lat = ev.net.interGPU, latInter
	}
	one, v := msg/bw+lat, l.Chunks()
	c.Detail.PPTime = 2 * float64(ev.m*v+l.PP-1) * one
	c.Detail.PPExposed = c.Detail.PPTime
	c.CommBytes.PP = 2 * float64(ev.m*v) * msg
}

// dataParallelComm is the gradient and parameter traffic of the DP group
// (ZeRO paper, section 7): ZeRO 0 all-reduces the gradients once per step;
// ZeRO 1 reduce-scatters them and all-gathers the updated weights (the same
// volume); ZeRO 2 reduce-scatters every micro-batch; ZeRO 3 also
// all-gathers the weights for every forward and backward (1.5× per
// micro-batch). DP peers are TP × PP ranks apart: they share a node only
// when that is below the GPUs per node. The traffic of ZeRO 0/1 overlaps the
// last micro-batch's backward (2/3 of its compute); ZeRO 2/3 traffic
// overlaps each micro-batch's compute.
func (ev *evaluation) dataParallelComm(c *Candidate, comp float64) {
	l, d := ev.l, &c.Detail
	if l.DP == 1 {
		return
	}
	w, g, _ := ev.stateBytes()
	psi := 0.0
	for _, st := range ev.stages[:ev.n] {
		psi = math.Max(psi, st.psi)
	}
	grads, weights := psi*g, psi*w
	k := max(1, min(l.DP, ev.net.gpn/(l.TP*l.PP)))
	if l.ZeroStage == 3 {
		// ZeRO-3 gathers each layer's weights with its own collectives over
		// the whole group, which reach no better than a flat ring: every GPU
		// pays its full volume on its share of the NICs. This reproduces the
		// fall of ZeRO-3's throughput with GPUs at a fixed batch
		// (Narayanan et al. 2021, Table 2); see docs/planner.md.
		k = 1
	}
	d.DPPerNode, d.DPInter = k, l.DP > k
	ar := func(bytes, factor float64) float64 { return ev.net.allReduce(bytes, l.DP, k, factor) }
	m := float64(ev.m)
	var passes, window float64 // passes: data volumes of (n−1)/n·bytes sent
	switch l.ZeroStage {
	case 0:
		d.DPTime, passes, window = ar(grads, 2), 2*grads, comp*2/3
	case 1:
		d.DPTime, passes, window = ar(grads, 1)+ar(weights, 1), grads+weights, comp*2/3
	case 2:
		d.DPTime, passes, window = m*ar(grads, 1)+ar(weights, 1), m*grads+weights, m*comp
	default:
		d.DPTime, passes, window = m*(ar(grads, 1)+2*ar(weights, 1)), m*(grads+2*weights), m*comp
	}
	n := float64(l.DP)
	c.CommBytes.DP = passes * (n - 1) / n
	d.DPExposed = math.Max(0, d.DPTime-window)
}
