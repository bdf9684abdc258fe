package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMax32MatchesGo: max32 (with its vector loop where the CPU has one)
// returns max32Go's value on rows of every length around the loop's
// blocks and the model's (T, V): random values, ties, rows of zeros of
// both signs, NaNs first and elsewhere. The sign of a zero maximum may
// differ (see max32), so values are compared with ==, NaN matching NaN.
func TestMax32MatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	nan := float32(math.NaN())
	lengths := []int{1, 2, 31, 32, 33, 63, 64, 65, 100, 1023, 1024, 50257}
	fills := map[string]func(i int) float32{
		"normal": func(int) float32 { return float32(rng.NormFloat64()) },
		"ties":   func(int) float32 { return float32(rng.IntN(3)) },
		"zeros":  func(int) float32 { return float32(math.Copysign(0, float64(rng.IntN(2)*2-1))) },
		"negative": func(int) float32 {
			return -1 - float32(rng.Float64())
		},
		"nan-first": func(i int) float32 {
			if i == 0 {
				return nan
			}
			return float32(rng.NormFloat64())
		},
		"nan-inside": func(i int) float32 {
			if i%37 == 5 {
				return nan
			}
			return float32(rng.NormFloat64())
		},
	}
	for name, fill := range fills {
		for _, n := range lengths {
			x := make([]float32, n)
			for i := range x {
				x[i] = fill(i)
			}
			got, want := max32(x), max32Go(x)
			if got != want && !(got != got && want != want) {
				t.Errorf("%s, %d elements: max32 = %v, want %v", name, n, got, want)
			}
		}
	}
}
