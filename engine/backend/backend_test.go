package backend

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/kernels"
)

// TestCPUMatmulBF16: with MatmulBF16, Matmul and the attention run on
// bfloat16 operands (kernels.SgemmBF16 and the attention's BF16 forms,
// results identical to calling them), without it on float32 ones, and the
// two differ (the inputs are not bfloat16 numbers).
func TestCPUMatmulBF16(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randn := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	const m, n, k = 33, 40, 70
	a, b, c0 := randn(m*k), randn(k*n), randn(m*n)
	matmul := func(be CPU, f func(int, bool, bool, int, int, int, float32, []float32, int, []float32, int, float32, []float32, int)) (got, want []float32) {
		got, want = slices.Clone(c0), slices.Clone(c0)
		be.Matmul(false, true, m, n, k, a, k, b, k, 1, got, n)
		f(2, false, true, m, n, k, 1, a, k, b, k, 1, want, n)
		return got, want
	}
	bf, wantBF := matmul(CPU{Threads: 2, MatmulBF16: true}, kernels.SgemmBF16)
	f32, wantF32 := matmul(CPU{Threads: 2}, kernels.Sgemm)
	if !slices.Equal(bf, wantBF) || !slices.Equal(f32, wantF32) || slices.Equal(bf, f32) {
		t.Errorf("Matmul: bf16 equals SgemmBF16 %v, fp32 equals Sgemm %v, they differ %v: want true, true, true",
			slices.Equal(bf, wantBF), slices.Equal(f32, wantF32), !slices.Equal(bf, f32))
	}

	const B, T, C, NH = 2, 9, 8, 2
	qkv, dout := randn(B*T*3*C), randn(B*T*C)
	attention := func(be CPU, fwd func(int, []float32, []float32, []float32, int, int, int, int),
		bwd func(int, []float32, []float32, []float32, []float32, []float32, int, int, int, int)) (got, want []float32) {
		out, att, dqkv := make([]float32, B*T*C), make([]float32, B*NH*T*T), make([]float32, len(qkv))
		be.Attention(out, att, qkv, B, T, C, NH)
		be.AttentionBackward(dqkv, dout, qkv, att, make([]float32, be.AttentionScratch(T)), B, T, C, NH)
		out2, att2, dqkv2 := make([]float32, B*T*C), make([]float32, B*NH*T*T), make([]float32, len(qkv))
		fwd(be.Threads, out2, att2, qkv, B, T, C, NH)
		bwd(be.Threads, dqkv2, dout, qkv, att2, make([]float32, be.AttentionScratch(T)), B, T, C, NH)
		return append(out, dqkv...), append(out2, dqkv2...)
	}
	bf, wantBF = attention(CPU{Threads: 2, MatmulBF16: true}, kernels.AttentionForwardBF16, kernels.AttentionBackwardBF16)
	f32, wantF32 = attention(CPU{Threads: 2}, kernels.AttentionForward, kernels.AttentionBackward)
	if !slices.Equal(bf, wantBF) || !slices.Equal(f32, wantF32) || slices.Equal(bf, f32) {
		t.Errorf("attention: bf16 equals the BF16 kernels %v, fp32 equals the float32 ones %v, they differ %v: want true, true, true",
			slices.Equal(bf, wantBF), slices.Equal(f32, wantF32), !slices.Equal(bf, f32))
	}
}
