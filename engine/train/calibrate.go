package train

import (
	"time"

	"github.com/gtrain/gtrain/engine/kernels"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// The calibration times one layer of the small preset (C = 384) over
// calibTokens tokens, a micro-batch of 2 sequences of 256: the shapes a
// small step runs, large enough to leave the caches as a step does, small
// enough that a round takes a few milliseconds.
const (
	calibEmbd   = 384
	calibTokens = 512
	calibRounds = 5 // timed rounds after one warm-up; the fastest counts
)

// MeasureCPU measures this host's speed at the engine's own work, on one
// core, in about 70 ms: the float32 GEMM on a layer's weight
// multiplies and the memory-bound kernels of a layer's forward and
// backward pass (kernels.Sgemm and the others with one thread), each
// multiply and each kernel timed on its own, the fastest of
// calibRounds rounds after a warm-up: a moment when another process held
// the core must hit every round of one of them to count. The links keep
// planner.DefaultCPUSpeed's figures: measuring them needs peers.
func MeasureCPU() planner.CPUSpeed {
	s := planner.DefaultCPUSpeed
	s.GEMMFLOPSPerCore = measureGEMM()
	s.KernelBytesPerSecPerCore = measureKernels()
	return s
}

// measureGEMM is one thread's float32 FLOP/s on a layer's four weight
// multiplies, forward: QKV, the attention projection, the MLP's two.
func measureGEMM() float64 {
	n, c := calibTokens, calibEmbd
	x, w, y := calibBuf(n*4*c), calibBuf(4*c*c), make([]float32, n*4*c)
	shapes := [][2]int{{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}} // k, n of each
	flops, sec := 0.0, 0.0
	for _, s := range shapes {
		flops += 2 * float64(n*s[0]*s[1])
		sec += fastest(func() { kernels.Sgemm(1, false, false, n, s[1], s[0], 1, x, s[0], w, s[1], 0, y, s[1]) })
	}
	return flops / sec
}

// measureKernels is the rate at which one thread of the engine's
// memory-bound kernels gets through the bytes the planner charges a layer
// for them (planner.LayerKernelBytes): what engine/model's block runs
// besides its multiplies and attention, forward then backward.
func measureKernels() float64 {
	n, c := calibTokens, calibEmbd
	in, res, proj, ln := calibBuf(n*c), make([]float32, n*c), calibBuf(n*c), make([]float32, n*c)
	fch, gelu, dfch := calibBuf(n*4*c), make([]float32, n*4*c), make([]float32, n*4*c)
	qkv, dres, dln := calibBuf(n*3*c), calibBuf(n*c), calibBuf(n*c)
	mean, rstd, wt, bias := make([]float32, n), make([]float32, n), calibBuf(4*c), calibBuf(4*c)
	dw, db := make([]float32, 4*c), make([]float32, 4*c)
	sec := 0.0
	for _, k := range []struct {
		times int
		run   func()
	}{
		{2, func() { kernels.LayerNormForward(1, ln, mean, rstd, in, wt, bias, n, c) }},
		{2, func() { kernels.AddBias(proj, bias, n, c) }}, // attention and MLP projections
		{1, func() { kernels.AddBias(qkv, bias[:3*c], n, 3*c) }},
		{1, func() { kernels.AddBias(fch, bias, n, 4*c) }},
		{2, func() { kernels.Residual(res, in, proj) }},
		{1, func() { kernels.GeluForward(1, gelu, fch) }},
		{2, func() { kernels.BiasBackward(db, dres, n, c) }},
		{1, func() { kernels.BiasBackward(db, dfch, n, 4*c) }},
		{1, func() { kernels.BiasBackward(db, qkv, n, 3*c) }},
		{1, func() { kernels.GeluBackward(1, dfch, fch, gelu) }},
		{2, func() { kernels.LayerNormBackward(1, dres, dw, db, dln, in, wt, mean, rstd, n, c) }},
	} {
		sec += float64(k.times) * fastest(k.run)
	}
	small := model.Presets["small"]
	m := planner.Model{Arch: planner.ArchGPT, Layers: 1, Hidden: calibEmbd, Heads: small.Heads, Vocab: small.Vocab,
		Seq: calibTokens}.Normalized()
	return planner.LayerKernelBytes(m, 1, engineActivations) / sec
}

// fastest is the shortest of calibRounds timed runs of f after one untimed
// one (page faults, the GEMM's packing buffers).
func fastest(f func()) float64 {
	f()
	best := time.Duration(1<<63 - 1)
	for range calibRounds {
		start := time.Now()
		f()
		best = min(best, time.Since(start))
	}
	return max(best.Seconds(), 1e-9)
}

// calibBuf is n small values: the kernels' speed does not depend on them,
// but denormals and NaNs could.
func calibBuf(n int) []float32 {
	b := make([]float32, n)
	for i := range b {
		b[i] = float32(i%17)/16 - 0.5
	}
	return b
}

// PredictLayout is the planner's prediction for spec's own layout on top,
// from the problem run --auto searches (enginePlan): the step time and the
// memory of the most loaded rank the planner would give that layout.
// docs/bench/grid.sh sets it beside the measured figures.
func PredictLayout(spec Spec, top planner.Topology) (planner.Candidate, error) {
	pr, err := enginePlan(spec, top)
	if err != nil {
		return planner.Candidate{}, err
	}
	p := spec.Parallel
	tp, pp, dp := max(p.TP, 1), max(p.PP, 1), p.DP
	if dp == 0 {
		dp = top.GPUs() / (tp * pp)
	}
	if tp*pp*dp != top.GPUs() {
		return planner.Candidate{}, usage.Errorf("predict: tp %d × pp %d × dp %d is not the %d ranks: set parallel.dp to 0 or to the ranks / (tp × pp)",
			tp, pp, dp, top.GPUs())
	}
	rc := planner.Recompute(spec.Recompute)
	if rc == "" {
		rc = planner.RecomputeNone
	}
	l := planner.Layout{Grid: planner.Grid{TP: tp, PP: pp, DP: dp}, ZeroStage: p.ZeroStage,
		MicroBatch: spec.Batch.MicroBatch, Recompute: rc}
	c := planner.Evaluate(pr, l)
	if c.GradAccum != spec.Batch.GradAccum {
		return c, usage.Errorf("predict: tp %d pp %d dp %d, micro_batch %d: the planner runs %d micro-batches per step where the job runs batch.grad_accum %d",
			tp, pp, dp, spec.Batch.MicroBatch, c.GradAccum, spec.Batch.GradAccum)
	}
	return c, nil
}
