package kernels

import (
	"fmt"
	"math"
)

// attnBlock is the number of query rows handled per Sgemm call. Row i only
// attends to keys 0..i, so a block of rows [i0, i1) needs scores against
// keys [0, i1) only: with 128-row blocks the matmuls do about T²/2 + 64·T
// multiply-adds per head instead of T², while each call stays large enough
// for the matmul's tiles and packing. At T = 1024, hs = 64 it ran about 10%
// faster than 64-row blocks and as fast as 256-row ones.
const attnBlock = 128

// AttentionScratch returns the length of the scratch buffer
// AttentionBackward needs: one T×T matrix (the score gradients of one head)
// per goroutine.
func AttentionScratch(threads, T int) int {
	return max(threads, 1) * T * T
}

// AttentionForward is GPT-2's causal multi-head self-attention. qkv is
// (B,T,3C), holding the query, key and value projections side by side along
// the last dimension, each split into NH heads of C/NH values. For every
// (batch, head) it computes the scores Q·Kᵀ/√(C/NH), masks the future
// (key > query), takes the softmax of each row, and writes the
// probability-weighted sum of V to out (B,T,C), heads concatenated.
// att (B,NH,T,T) receives the probabilities for AttentionBackward, with 0
// above the diagonal.
//
// The matmuls read Q, K and V in place, as strided views of qkv (row stride
// 3C), and the (batch, head) pairs are shared among up to threads
// goroutines, each calling Sgemm on one thread. The softmax sums run in
// float32: a row has at most T terms, each at most 1, and an error in the
// sum rescales the whole row by the same factor.
func AttentionForward(threads int, out, att, qkv []float32, B, T, C, NH int) {
	attentionForward(Sgemm, threads, out, att, qkv, B, T, C, NH)
}

// AttentionForwardBF16 is AttentionForward with its matmuls (scores and
// the weighted sum of V) on operands rounded to bfloat16 (SgemmBF16), as
// mixed precision runs them; the softmax stays float32.
func AttentionForwardBF16(threads int, out, att, qkv []float32, B, T, C, NH int) {
	attentionForward(SgemmBF16, threads, out, att, qkv, B, T, C, NH)
}

// gemmFunc is Sgemm or SgemmBF16.
type gemmFunc func(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

func attentionForward(gemm gemmFunc, threads int, out, att, qkv []float32, B, T, C, NH int) {
	pairs := B * NH
	// B·T²·C is proportional to the multiply-adds of all heads.
	if nw := workersFor(threads, pairs, B*T*T*C); nw > 1 {
		parallelFor(nw, pairs, func(_, lo, hi int) {
			for p := lo; p < hi; p++ {
				attentionForwardHead(gemm, out, att, qkv, p/NH, p%NH, T, C, NH)
			}
		})
		return
	}
	for p := range pairs {
		attentionForwardHead(gemm, out, att, qkv, p/NH, p%NH, T, C, NH)
	}
}

// attentionForwardHead is AttentionForward for batch b, head h.
func attentionForwardHead(gemm gemmFunc, out, att, qkv []float32, b, h, T, C, NH int) {
	hs, C3 := C/NH, 3*C
	base := b*T*C3 + h*hs
	q, k, v := qkv[base:], qkv[base+C:], qkv[base+2*C:]
	a := att[(b*NH+h)*T*T : (b*NH+h+1)*T*T]
	o := out[b*T*C+h*hs:]
	scale := float32(1 / math.Sqrt(float64(hs)))
	for i0 := 0; i0 < T; i0 += attnBlock {
		i1 := min(i0+attnBlock, T)
		gemm(1, false, true, i1-i0, i1, hs, scale, q[i0*C3:], C3, k, C3, 0, a[i0*T:], T)
		for i := i0; i < i1; i++ {
			softmaxCausalRow(a[i*T:i*T+T], i)
		}
		// Row i of the block is zero past column i, so keys [0, i1) are all
		// the block needs.
		gemm(1, false, false, i1-i0, hs, i1, 1, a[i0*T:], T, v, C3, 0, o[i0*C:], C)
	}
}

// softmaxCausalRow replaces the scores row[0..i] by their softmax and sets
// the masked rest of the row to 0.
func softmaxCausalRow(row []float32, i int) {
	s := row[:i+1]
	subScalar(s, max32(s))
	expInPlace(s)
	mulScalar(s, 1/sum32(s))
	clear(row[i+1:])
}

// AttentionBackward adds the gradient of AttentionForward with respect to
// qkv to dqkv (B,T,3C), given dout (B,T,C) and the qkv and att of the
// forward pass; it accumulates. scratch must hold at least
// AttentionScratch(threads, T) values; its contents are overwritten.
//
// For each (batch, head), with P the probabilities and dO the head's slice
// of dout: dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P ⊙ (dP - rowsum(P ⊙ dP)) (the
// softmax's gradient), dQ += dS·K/√hs and dK += dSᵀ·Q/√hs, all as Sgemm
// calls on the causal lower triangle in blocks of attnBlock rows.
func AttentionBackward(threads int, dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int) {
	attentionBackward(Sgemm, threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
}

// AttentionBackwardBF16 is AttentionBackward with its matmuls on operands
// rounded to bfloat16 (SgemmBF16); the softmax's gradient stays float32.
func AttentionBackwardBF16(threads int, dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int) {
	attentionBackward(SgemmBF16, threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
}

func attentionBackward(gemm gemmFunc, threads int, dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int) {
	pairs := B * NH
	nw := workersFor(threads, pairs, B*T*T*C)
	if need := nw * T * T; len(scratch) < need {
		panic(fmt.Sprintf("kernels: AttentionBackward: scratch has %d values, need %d", len(scratch), need))
	}
	if nw > 1 {
		parallelFor(nw, pairs, func(w, lo, hi int) {
			ds := scratch[w*T*T : (w+1)*T*T]
			for p := lo; p < hi; p++ {
				attentionBackwardHead(gemm, dqkv, dout, qkv, att, ds, p/NH, p%NH, T, C, NH)
			}
		})
		return
	}
	for p := range pairs {
		attentionBackwardHead(gemm, dqkv, dout, qkv, att, scratch[:T*T], p/NH, p%NH, T, C, NH)
	}
}

// attentionBackwardHead is AttentionBackward for batch b, head h, with ds
// (T×T) as its scratch.
func attentionBackwardHead(gemm gemmFunc, dqkv, dout, qkv, att, ds []float32, b, h, T, C, NH int) {
	hs, C3 := C/NH, 3*C
	base := b*T*C3 + h*hs
	q, k, v := qkv[base:], qkv[base+C:], qkv[base+2*C:]
	dq, dk, dv := dqkv[base:], dqkv[base+C:], dqkv[base+2*C:]
	do := dout[b*T*C+h*hs:]
	a := att[(b*NH+h)*T*T : (b*NH+h+1)*T*T]
	scale := float32(1 / math.Sqrt(float64(hs)))
	for i0 := 0; i0 < T; i0 += attnBlock {
		i1 := min(i0+attnBlock, T)
		gemm(1, false, true, i1-i0, i1, hs, 1, do[i0*C:], C, v, C3, 0, ds[i0*T:], T)
		for i := i0; i < i1; i++ {
			softmaxBackwardRow(ds[i*T:i*T+i1], a[i*T:i*T+i+1])
		}
		gemm(1, false, false, i1-i0, hs, i1, scale, ds[i0*T:], T, k, C3, 1, dq[i0*C3:], C3)
	}
	// Key j receives gradient from queries i ≥ j only. For the keys of a
	// block [j0, j1) those are rows [j0, T) of dS and P; within them,
	// entries above the diagonal are 0 (the block's own rows were cleared
	// past i, the later blocks' rows cover all of [j0, j1)).
	for j0 := 0; j0 < T; j0 += attnBlock {
		j1 := min(j0+attnBlock, T)
		gemm(1, true, false, j1-j0, hs, T-j0, scale, ds[j0*T+j0:], T, q[j0*C3:], C3, 1, dk[j0*C3:], C3)
		gemm(1, true, false, j1-j0, hs, T-j0, 1, a[j0*T+j0:], T, do[j0*C:], C, 1, dv[j0*C3:], C3)
	}
}

// softmaxBackwardRow turns row i of dP into dS in place: ds holds dP for
// keys [0, i1) and p the probabilities for keys [0, i]. Keys past i (masked)
// get 0, which the blocked matmuls that follow rely on.
func softmaxBackwardRow(ds, p []float32) {
	g := ds[:len(p)]
	softmaxGrad(g, p, dot32(p, g))
	clear(ds[len(p):])
}
