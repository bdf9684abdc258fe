package zero

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refSquares is squares.add as it was: one test per element.
func refSquares(s *squares, g []float32) {
	for _, v := range g {
		f := float64(v)
		switch {
		case f != f:
			s.nan++
		case math.IsInf(f, 0):
			s.inf++
		default:
			s.sum += f * f
		}
	}
}

// TestSquaresMatchesElementwise: squares.add, whose finite fast path has
// no test per element, gives the sum (bit for bit) and the NaN and
// infinity counts of the element-by-element loop, over pieces added one
// after another, with no, one or several non-finite values, and with the
// largest float32 values (whose squares must not overflow the sum).
func TestSquaresMatchesElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32}
	for _, nbad := range []int{0, 1, 3} {
		for _, n := range []int{0, 1, 7, 1000} {
			t.Run(fmt.Sprintf("bad%d/n%d", nbad, n), func(t *testing.T) {
				var got, want squares
				for piece := range 3 {
					g := make([]float32, n)
					for i := range g {
						g[i] = float32(r.NormFloat64()) * 1e-3
					}
					for range nbad {
						if n > 0 && piece == 1 {
							g[r.IntN(n)] = bad[r.IntN(len(bad))]
						}
					}
					got.add(g)
					refSquares(&want, g)
					if math.Float64bits(got.sum) != math.Float64bits(want.sum) || got.nan != want.nan || got.inf != want.inf {
						t.Fatalf("piece %d: got %+v, want %+v", piece, got, want)
					}
				}
			})
		}
	}
}

// BenchmarkSquares compares squares.add with the element-by-element loop
// on the small preset's 10.7M gradients.
func BenchmarkSquares(b *testing.B) {
	g := make([]float32, 10_700_000)
	for i := range g {
		g[i] = float32(i%1000) * 1e-6
	}
	for _, c := range []struct {
		name string
		f    func(*squares, []float32)
	}{{"elementwise", refSquares}, {"add", (*squares).add}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(4 * int64(len(g)))
			for b.Loop() {
				var s squares
				c.f(&s, g)
			}
		})
	}
}
