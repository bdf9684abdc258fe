package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// newRand returns a deterministic generator so a failure reproduces.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// randSlice returns n values uniform in [-scale, scale).
func randSlice(r *rand.Rand, n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = (2*r.Float32() - 1) * scale
	}
	return s
}

// randTokens returns n token ids below V.
func randTokens(r *rand.Rand, n, V int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.IntN(V))
	}
	return s
}

// filled returns n copies of v.
func filled(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// lowerParallelThreshold makes every kernel take its parallel path for the
// rest of the test, so that small shapes exercise the goroutine split.
func lowerParallelThreshold(t *testing.T) {
	old := minParallelWork
	minParallelWork = 1
	t.Cleanup(func() { minParallelWork = old })
}

// assertClose fails unless got[i] is within atol + rtol·|want[i]| of
// want[i] for every i.
func assertClose(t *testing.T, name string, got []float32, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", name, len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), want[i]
		if !(math.Abs(g-w) <= atol+rtol*math.Abs(w)) {
			t.Fatalf("%s[%d] = %g, want %g (diff %.3g)", name, i, g, w, g-w)
		}
	}
}

// assertSame fails unless a and b are bit-for-bit equal.
func assertSame(t *testing.T, name string, a, b []float32) {
	t.Helper()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s[%d]: %g != %g", name, i, a[i], b[i])
		}
	}
}

// weightedSum is the scalar loss of the gradient checks, Σ out·w, in
// float64 so the sum adds no rounding of its own to the float32 outputs.
// It also returns Σ|out·w|, the scale of the loss's rounding noise.
func weightedSum(out, w []float32) (sum, abs float64) {
	for i := range out {
		p := float64(out[i]) * float64(w[i])
		sum += p
		abs += math.Abs(p)
	}
	return sum, abs
}
