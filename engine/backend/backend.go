// Package backend is the seam between the engine's model and the hardware
// that computes it. The model calls only these operations; the CPU backend
// runs them with engine/kernels on goroutines. A GPU backend implements the
// same interface over device memory without touching the model.
package backend

import "github.com/gtrain/gtrain/engine/kernels"

// Backend computes the forward and backward operations of a transformer on
// flat row-major float32 buffers. Backward operations accumulate into their
// gradient outputs (+=) unless a method says it writes.
type Backend interface {
	// Name identifies the backend in status records ("cpu").
	Name() string
	// Matmul computes C = op(A)·op(B) + beta·C (see kernels.Sgemm).
	Matmul(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	Encoder(out []float32, inp []int32, wte, wpe []float32, B, T, C int)
	EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int)
	LayerNorm(out, mean, rstd, inp, weight, bias []float32, N, C int)
	LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, N, C int)
	Gelu(out, inp []float32)
	GeluBackward(dinp, inp, dout []float32)
	AddBias(out, bias []float32, N, OC int)
	BiasBackward(dbias, dout []float32, N, OC int)
	Residual(out, a, b []float32)
	Attention(out, att, qkv []float32, B, T, C, NH int)
	// AttentionBackward needs scratch of AttentionScratch(T) elements.
	AttentionBackward(dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int)
	AttentionScratch(T int) int
	CrossEntropy(losses, probs, logits []float32, targets []int32, N, V int)
	// CrossEntropyBackward writes dlogits (which may alias probs).
	CrossEntropyBackward(dlogits, probs []float32, targets []int32, dloss float32, N, V int)
}

// BF16Weights is a Backend that can multiply by weights kept in bfloat16,
// as mixed-precision training keeps its working parameters, without their
// float32 decoding: the model then hands it the store's bfloat16 matrices
// in place (model.BF16Weights), and the results are those of its float32
// methods on the decoded weights, bit for bit.
type BF16Weights interface {
	// TakesBF16Weights reports whether the matmuls round their operands
	// to bfloat16 anyway: only then are the methods below the same
	// computation as the float32 ones.
	TakesBF16Weights() bool
	// MatmulBF16B is Matmul with B given as bfloat16 bits.
	MatmulBF16B(transA, transB bool, m, n, k int, a []float32, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int)
	// EncoderBF16 is Encoder with the embeddings given as bfloat16 bits.
	EncoderBF16(out []float32, inp []int32, wte, wpe []uint16, B, T, C int)
}

// CPU runs every operation on this machine's cores with engine/kernels.
type CPU struct {
	Threads int // goroutines per operation; below 1 means one

	// MatmulBF16 makes Matmul and the matmuls inside Attention and
	// AttentionBackward multiply their operands rounded to bfloat16, with
	// float32 sums (kernels.SgemmBF16: AVX-512 BF16 where the CPU has it),
	// as mixed-precision training does (PyTorch's autocast runs mm and bmm
	// so). Everything else stays float32: the outputs and the gradients
	// Matmul adds into, layer norms, softmax, GELU and the loss.
	MatmulBF16 bool
}

// Name reports "cpu".
func (c CPU) Name() string { return "cpu" }

// Matmul implements Backend.
func (c CPU) Matmul(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, cc []float32, ldc int) {
	if c.MatmulBF16 {
		kernels.SgemmBF16(c.Threads, transA, transB, m, n, k, 1, a, lda, b, ldb, beta, cc, ldc)
		return
	}
	kernels.Sgemm(c.Threads, transA, transB, m, n, k, 1, a, lda, b, ldb, beta, cc, ldc)
}

// TakesBF16Weights implements BF16Weights: true with MatmulBF16.
func (c CPU) TakesBF16Weights() bool { return c.MatmulBF16 }

// MatmulBF16B implements BF16Weights (kernels.SgemmBF16B).
func (c CPU) MatmulBF16B(transA, transB bool, m, n, k int, a []float32, lda int, b []uint16, ldb int, beta float32, cc []float32, ldc int) {
	kernels.SgemmBF16B(c.Threads, transA, transB, m, n, k, 1, a, lda, b, ldb, beta, cc, ldc)
}

// EncoderBF16 implements BF16Weights.
func (c CPU) EncoderBF16(out []float32, inp []int32, wte, wpe []uint16, B, T, C int) {
	kernels.EncoderForwardBF16(out, inp, wte, wpe, B, T, C)
}

// Encoder implements Backend.
func (c CPU) Encoder(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	kernels.EncoderForward(out, inp, wte, wpe, B, T, C)
}

// EncoderBackward implements Backend.
func (c CPU) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	kernels.EncoderBackward(dwte, dwpe, dout, inp, B, T, C)
}

// LayerNorm implements Backend.
func (c CPU) LayerNorm(out, mean, rstd, inp, weight, bias []float32, N, C int) {
	kernels.LayerNormForward(c.Threads, out, mean, rstd, inp, weight, bias, N, C)
}

// LayerNormBackward implements Backend.
func (c CPU) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, N, C int) {
	kernels.LayerNormBackward(c.Threads, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C)
}

// Gelu implements Backend.
func (c CPU) Gelu(out, inp []float32) { kernels.GeluForward(c.Threads, out, inp) }

// GeluBackward implements Backend.
func (c CPU) GeluBackward(dinp, inp, dout []float32) {
	kernels.GeluBackward(c.Threads, dinp, inp, dout)
}

// AddBias implements Backend.
func (c CPU) AddBias(out, bias []float32, N, OC int) {
	kernels.AddBiasThreads(c.Threads, out, bias, N, OC)
}

// BiasBackward implements Backend.
func (c CPU) BiasBackward(dbias, dout []float32, N, OC int) {
	kernels.BiasBackwardThreads(c.Threads, dbias, dout, N, OC)
}

// Residual implements Backend.
func (c CPU) Residual(out, a, b []float32) { kernels.ResidualThreads(c.Threads, out, a, b) }

// Attention implements Backend.
func (c CPU) Attention(out, att, qkv []float32, B, T, C, NH int) {
	if c.MatmulBF16 {
		kernels.AttentionForwardBF16(c.Threads, out, att, qkv, B, T, C, NH)
		return
	}
	kernels.AttentionForward(c.Threads, out, att, qkv, B, T, C, NH)
}

// AttentionBackward implements Backend.
func (c CPU) AttentionBackward(dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int) {
	if c.MatmulBF16 {
		kernels.AttentionBackwardBF16(c.Threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
		return
	}
	kernels.AttentionBackward(c.Threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
}

// AttentionScratch implements Backend.
func (c CPU) AttentionScratch(T int) int { return kernels.AttentionScratch(c.Threads, T) }

// CrossEntropy implements Backend.
func (c CPU) CrossEntropy(losses, probs, logits []float32, targets []int32, N, V int) {
	kernels.CrossEntropyForward(c.Threads, losses, probs, logits, targets, N, V)
}

// CrossEntropyBackward implements Backend.
func (c CPU) CrossEntropyBackward(dlogits, probs []float32, targets []int32, dloss float32, N, V int) {
	kernels.CrossEntropyBackward(c.Threads, dlogits, probs, targets, dloss, N, V)
}
