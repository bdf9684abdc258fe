package planner

import "math"

// time fills the step time, throughput and communication of c:
//
//	step = m·T + (p−1)·T + exposed PP sends + exposed DP/ZeRO traffic
//
// where T is the slowest stage's time for one micro-batch (its compute at
// the calibrated efficiency plus its TP collectives, which Megatron-LM does
// not overlap) and (p−1)·T is the 1F1B pipeline bubble, (p−1)/m of the
// ideal time (Narayanan et al. 2021, section 2.2.1).
func (ev *evaluation) time(c *Candidate) {
	l, pr := ev.l, ev.pr
	d := &c.Detail
	d.GEMMEfficiency = gemmEfficiency(pr.Options, pr.Model, l.MicroBatch, l.TP)
	rate := pr.Topology.GPU.Peak(pr.Precision) * d.GEMMEfficiency
	var slowest, comp, tp float64
	for _, st := range ev.stages[:ev.n] {
		f := ev.stageFLOPs(st) / rate
		t := ev.stageTP(st)
		if f+t > slowest {
			slowest, comp, tp = f+t, f, t
		}
	}
	m, p := float64(ev.m), float64(l.PP)
	d.Compute = m * slowest
	d.BubbleTime = (p - 1) * slowest
	d.TPTime = m * tp
	c.CommBytes.TP = m * ev.tpBytes(ev.stages[0])
	ev.pipelineComm(c)
	ev.dataParallelComm(c, comp)
	c.StepTime = d.Compute + d.BubbleTime + d.PPExposed + d.DPExposed
	c.Bubble = (p - 1) / m
	d.ModelFLOPs = ModelFLOPs(pr.Model, pr.GlobalBatch)
	d.HardwareFLOPs = HardwareFLOPs(pr.Model, pr.GlobalBatch, l.Recompute)
	gpus := float64(l.World())
	c.TFLOPSPerGPU = d.HardwareFLOPs / (c.StepTime * gpus) / 1e12
	c.MFU = d.ModelFLOPs / (c.StepTime * gpus * pr.Topology.GPU.Peak(pr.Precision))
}

// stageFLOPs is one GPU's FLOPs for one micro-batch on stage st: forward,
// backward (2× forward) and recomputation of its layers, and the output
// layer on the last stage, split over TP.
func (ev *evaluation) stageFLOPs(st stage) float64 {
	m, b := ev.pr.Model, float64(ev.l.MicroBatch)
	f := float64(st.layers) * (3*layerForward(m, b) + recomputeForward(m, b, ev.l.Recompute))
	// The attention core (scores, softmax, their product with V: 4·b·s²·h
	// forward) runs as batched small multiplies at a fraction of the GEMM
	// rate: count its FLOPs as if they were 1/attentionEfficiency as many.
	core := 4 * b * float64(m.Seq) * float64(m.Seq) * float64(m.Hidden)
	coreRuns := 3.0
	if ev.l.Recompute != RecomputeNone {
		coreRuns = 4
	}
	f += float64(st.layers) * coreRuns * core * (1/attentionEfficiency - 1)
	if st.index == ev.l.PP-1 {
		f += 6 * b * float64(m.Seq) * float64(m.Hidden) * float64(m.Vocab)
	}
	return f / float64(ev.l.TP)
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
// slots' sends, so they count as exposed.
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
	one := msg/bw + lat
	c.Detail.PPTime = 2 * float64(ev.m+l.PP-1) * one
	c.Detail.PPExposed = c.Detail.PPTime
	c.CommBytes.PP = 2 * float64(ev.m) * msg
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
	w, g, _ := ev.pr.Precision.stateBytes()
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
