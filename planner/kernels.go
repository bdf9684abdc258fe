package planner

// The compute model (docs/planner.md, "Compute"): a layer's time on one GPU
// is its matrix multiplies, each at a fraction of peak that falls with its
// smallest dimensions, plus its memory-bound kernels (LayerNorm, softmax,
// dropout, GELU, residual adds), which move bytes rather than compute and
// so run at the memory bandwidth. Per FLOP of the weight multiplies
// (24·s·h²/t per token and layer), the memory-bound work is a constant per
// hidden unit (∝ 1/h) plus the a·s² attention scores (∝ s/(h·d_head)): it
// weighs most in small models, which is why they reach a lower fraction of
// peak (Narayanan et al. 2021, Table 1: 1.7B at 44%, 1T at 52%).

// memoryEfficiency is the fraction of the data sheet's memory bandwidth that
// streaming element-wise kernels reach (about 1.6 of an A100-80GB's 2.04
// TB/s, as bandwidth tests and fused element-wise kernels measure it).
const memoryEfficiency = 0.8

// gemmHalf is the matrix dimension at which a multiply runs at half its
// plateau (see gemm.time): tiles of 128–256 rows and columns, and the
// waves of tiles over the GPU's multiprocessors, are filled worse by small
// dimensions.
const gemmHalf = 128

// gemmHalfOf is g's GEMMHalf, gemmHalf when it has none.
func gemmHalfOf(g GPU) float64 {
	if g.GEMMHalf > 0 {
		return g.GEMMHalf
	}
	return gemmHalf
}

// gemm is count multiplies of an m×k by a k×n matrix: 2·m·k·n FLOPs each.
type gemm struct{ m, k, n, count float64 }

// flops is what g computes.
func (g gemm) flops() float64 { return 2 * g.m * g.k * g.n * g.count }

// efficiency is the fraction of peak g reaches: the plateau eff times
// sat(m)·sat(k)·sat(n), sat(x) = x/(x + half), half being the device's
// (gemmHalfOf). The product is symmetric in the three dimensions, so a
// multiply's two backward multiplies (same dimensions, permuted) run at
// its forward rate.
func (g gemm) efficiency(eff, half float64) float64 {
	return eff * sat(g.m, half) * sat(g.k, half) * sat(g.n, half)
}

// gemmTime is the time of gs at peak FLOP/s with plateau efficiency eff
// on a device whose multiplies reach half of it at dimension half.
func gemmTime(eff, peak, half float64, gs ...gemm) float64 {
	var sec float64
	for _, g := range gs {
		sec += g.flops() / (peak * g.efficiency(eff, half))
	}
	return sec
}

// layerGEMMs are one layer's weight multiplies, forward, on one of t TP
// ranks (Megatron-LM's split): QKV and the MLP's first matrix (or SwiGLU's
// gate and up) column-parallel, the attention projection and the MLP's
// last matrix row-parallel; b·s rows each.
func layerGEMMs(m Model, b, t int) []gemm {
	rows, h, f, tf := float64(b*m.Seq), float64(m.Hidden), float64(m.FFN), float64(t)
	up := f / tf
	if m.Arch == ArchLlama {
		up *= 2 // gate and up, fused or not: same shape
	}
	return []gemm{
		{rows, h, m.qkvWidth() / tf, 1},
		{rows, h / tf, h, 1},
		{rows, h, up, 1},
		{rows, f / tf, h, 1},
	}
}

// attentionGEMMs are the attention core's batched multiplies, forward, on
// one of t TP ranks: scores Q·Kᵀ (s×d_head by d_head×s) and their product
// with V (s×s by s×d_head) for each of the b·a/t heads, 4·b·s²·h/t FLOPs.
// Their short inner or outer dimension d_head keeps them well below the
// plateau.
func attentionGEMMs(m Model, b, t int) []gemm {
	s, dh := float64(m.Seq), float64(m.Hidden)/float64(m.Heads)
	heads := float64(b) * float64(m.Heads) / float64(t)
	return []gemm{{s, dh, s, heads}, {s, s, dh, heads}}
}

// outputGEMM is the output layer's multiply, forward, on one of t TP ranks
// (vocabulary-parallel).
func outputGEMM(m Model, b, t int) gemm {
	return gemm{float64(b * m.Seq), float64(m.Hidden), float64(m.Vocab) / float64(t), 1}
}

// traffic is the bytes memory-bound kernels move on one GPU for one
// micro-batch: in a forward pass, in the backward pass, and the part of
// the forward that is the attention core's (what a selective recompute
// runs again).
type traffic struct{ fwd, bwd, core float64 }

// layerTraffic is the memory-bound traffic of one transformer layer as
// Megatron-LM runs it with its fused kernels: each kernel reads its inputs
// and writes its outputs once, e bytes an element, 1 byte a dropout mask.
//
// Per token, on h elements (on all TP ranks; on a 1/t shard with sequence
// parallelism): forward, two LayerNorms (read, write) and two fused
// bias-dropout-residual-adds (read 2, write 1 and the mask), 10e + 2;
// backward, two LayerNorms (read the gradient and the input, write 3e),
// two dropouts (read the gradient and the mask, write), two residual
// gradient sums (read 2, write 1), 16e + 2.
//
// Per token on one TP rank: the attention output's relayout to [s, b, h]
// (read, write 2e·h/t each way) and the fused bias-GELU on f/t (read,
// write: 2e·f/t forward, read the gradient and input and write 3e·f/t
// backward; SwiGLU 3e and 5e).
//
// Per attention score (b·a·s²/t): forward, the fused scale-mask-softmax
// (read, write) and the dropout (read, write, mask), 4e + 1; backward, the
// dropout (read the gradient and the mask, write) and the softmax (read
// the gradient and the output, write), 5e + 1. The batched multiplies'
// own score traffic is in coreTime. Without dropout (mask 0) its kernels
// go.
func (x actShape) layerTraffic(m Model) traffic {
	e, mask := x.e, x.mask
	tokens := x.s * x.b
	repl := tokens * x.h
	if x.sp {
		repl /= x.t
	}
	drop := 0.0
	if mask > 0 {
		drop = 1
	}
	act, actBack := 2.0, 3.0
	if m.Arch == ArchLlama {
		act, actBack = 3, 5
	}
	split := tokens / x.t
	f := float64(m.FFN)
	scores := x.b * x.a * x.s * x.s / x.t
	core := scores * (2*e + drop*(2*e+mask))
	return traffic{
		fwd:  repl*(4*e+2*(3*e+mask)) + split*e*(2*x.h+act*f) + core,
		bwd:  repl*(6*e+2*(2*e+mask)+6*e) + split*e*(2*x.h+actBack*f) + scores*(3*e+drop*(2*e+mask)),
		core: core,
	}
}

// headTraffic is the last stage's cross-entropy over V/t logits a token,
// in fp32 as Megatron-LM computes it: forward, read the e-byte logits and
// write them as fp32, then the vocabulary-parallel max, subtraction,
// exponential, sum and division (nine 4-byte passes); backward, the
// softmax minus the one-hot and the scaling (five passes), written back as
// e bytes for the output layer.
func (x actShape) headTraffic(vocab int) traffic {
	logits := x.s * x.b * float64(vocab) / x.t
	return traffic{fwd: logits * (x.e + 4 + 9*4), bwd: logits * (5*4 + x.e)}
}

// optimizerBytes is the memory traffic of the optimizer step per parameter
// of a GPU's shard: with mixed precision (Megatron-LM's fp16/bf16
// optimizer), the 16-bit gradients copied to fp32 (read 2, write 4) and
// zeroed for the next step (2), then on the ZeRO shard the unscaling and
// overflow check (read, write 4), the gradient norm (read 4), Adam (read
// weight, gradient and both moments, write three: 28) and the copy back to
// 16-bit weights (read 4, write 2); in fp32, zeroing (4), the norm (4) and
// Adam (28).
func optimizerBytes(p Precision) (full, shard float64) {
	if p == FP32 {
		return 4, 4 + 28
	}
	return 6 + 2, 8 + 4 + 28 + 6
}
