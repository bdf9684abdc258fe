package kernels

import (
	"fmt"
	"testing"
)

// Benchmarks at GPT-2 small sizes (C = 768, 12 heads, V = 50257), for
// comparing with PyTorch on the same machine. Run one at a time with
// -bench 'Name' -benchtime 10x: the buffers are large.

func benchThreads(b *testing.B, f func(b *testing.B, threads int)) {
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads%d", threads), func(b *testing.B) { f(b, threads) })
	}
}

func BenchmarkLayerNorm(b *testing.B) {
	r := newRand(40)
	N, C := 1024, 768
	x, w, d := randSlice(r, N*C, 1), randSlice(r, C, 1), randSlice(r, N*C, 1)
	out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
	dw := make([]float32, C)
	benchThreads(b, func(b *testing.B, threads int) {
		b.SetBytes(int64(4 * N * C))
		for b.Loop() {
			LayerNormForward(threads, out, mean, rstd, x, w, w, N, C)
			LayerNormBackward(threads, out, dw, dw, d, x, w, mean, rstd, N, C)
		}
	})
}

func BenchmarkGelu(b *testing.B) {
	r := newRand(41)
	n := 1024 * 3072
	x, out, d := randSlice(r, n, 3), make([]float32, n), randSlice(r, n, 1)
	benchThreads(b, func(b *testing.B, threads int) {
		b.SetBytes(int64(4 * n))
		for b.Loop() {
			GeluForward(threads, out, x)
			GeluBackward(threads, out, x, d)
		}
	})
}

func BenchmarkAttention(b *testing.B) {
	r := newRand(42)
	B, T, C, NH := 1, 1024, 768, 12
	qkv, dout := randSlice(r, B*T*3*C, 1), randSlice(r, B*T*C, 1)
	out, att, dqkv := make([]float32, B*T*C), make([]float32, B*NH*T*T), make([]float32, B*T*3*C)
	scratch := make([]float32, AttentionScratch(2, T))
	benchThreads(b, func(b *testing.B, threads int) {
		b.Run("forward", func(b *testing.B) {
			for b.Loop() {
				AttentionForward(threads, out, att, qkv, B, T, C, NH)
			}
		})
		b.Run("backward", func(b *testing.B) {
			for b.Loop() {
				AttentionBackward(threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
			}
		})
	})
}

func BenchmarkCrossEntropy(b *testing.B) {
	r := newRand(43)
	N, V := 128, 50257
	logits, targets := randSlice(r, N*V, 5), randTokens(r, N, V)
	losses, probs := make([]float32, N), make([]float32, N*V)
	benchThreads(b, func(b *testing.B, threads int) {
		b.SetBytes(int64(4 * N * V))
		for b.Loop() {
			CrossEntropyForward(threads, losses, probs, logits, targets, N, V)
			CrossEntropyBackward(threads, probs, probs, targets, 1/float32(N), N, V)
		}
	})
}

func BenchmarkBiasBackward(b *testing.B) {
	r := newRand(44)
	N, OC := 2048, 1536
	dout, dbias := randSlice(r, N*OC, 1), make([]float32, OC)
	b.SetBytes(int64(4 * N * OC))
	for b.Loop() {
		BiasBackward(dbias, dout, N, OC)
	}
}
