// Package kernels holds the float32 CPU compute of gtrain's engine: the
// matrix multiply (SIMD micro-kernels with a portable fallback) and the
// forward and backward passes of the transformer's other operations. Every
// function works on flat row-major slices; shapes are passed explicitly, as
// in llm.c, so the model needs no tensor library and a GPU backend can
// implement the same calls.
//
// The element-wise loops (GELU, layer norm, softmax, bias, residual) have
// AVX2 forms in Go assembly (elementwise_amd64.s) that round every
// operation as the Go loops do, in the same order, so a result never
// depends on which one ran; the Go loops run under purego, -race and on
// other CPUs.
package kernels
