package kernels

import "testing"

// Per-element costs of the primitives every softmax is made of.

func BenchmarkExpInPlace(b *testing.B) {
	x := randSlice(newRand(50), 4096, 10)
	y := make([]float32, len(x))
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		copy(y, x)
		expInPlace(y)
	}
}

func BenchmarkMax32(b *testing.B) {
	x := randSlice(newRand(51), 4096, 10)
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		max32(x)
	}
}

func BenchmarkSum32(b *testing.B) {
	x := randSlice(newRand(52), 4096, 10)
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		sum32(x)
	}
}
