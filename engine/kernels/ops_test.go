package kernels

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// expImpls are the implementations of expInPlace this machine can run.
func expImpls() map[string]func([]float32) {
	m := map[string]func([]float32){"go": expInPlaceGo}
	if useAVX2Exp {
		m["avx2"] = expInPlaceAVX2
	}
	return m
}

func TestExpAccuracy(t *testing.T) {
	// Every step of 1/1024 across the range where the result is a normal
	// float32, then the edges and specials. The lengths are not multiples
	// of 8, so the vector version's tail is covered too.
	var grid []float32
	for x := float32(expMin); x <= expMax; x += 1.0 / 1024 {
		grid = append(grid, x)
	}
	inf := float32(math.Inf(1))
	special := []float32{0, -100, -inf, 100, inf, 88.7, float32(math.NaN())}
	for name, exp := range expImpls() {
		t.Run(name, func(t *testing.T) {
			got := slices.Clone(grid)
			exp(got)
			var maxRel float64
			for i, x := range grid {
				want := math.Exp(float64(x))
				maxRel = max(maxRel, math.Abs(float64(got[i])-want)/want)
			}
			t.Logf("max relative error %.3g (%.2f ulp)", maxRel, maxRel/0x1p-24)
			if maxRel > 2*0x1p-23 { // 2 ulp
				t.Errorf("max relative error %.3g, want ≤ 2 ulp", maxRel)
			}
			got = slices.Clone(special)
			exp(got)
			for i, want := range []float32{1, 0, 0, inf, inf} {
				if got[i] != want {
					t.Errorf("exp(%g) = %g, want %g", special[i], got[i], want)
				}
			}
			if math.IsInf(float64(got[5]), 0) || !math.IsNaN(float64(got[6])) {
				t.Errorf("exp(88.7) = %g, want finite; exp(NaN) = %g, want NaN", got[5], got[6])
			}
		})
	}
}

func TestGeluAccuracy(t *testing.T) {
	// The error scaled by max(1, |x|) is what reaches the next layer. The
	// relative error shows there is no cancellation for negative x: what
	// is left comes from rounding u in float32, amplified by e^(-2u)'s
	// condition number 2|u| (up to ~90 before the result underflows).
	var maxAbs, maxRel, maxRelBig float64
	for x := float32(-10); x <= 10; x += 1.0 / 4096 {
		out := []float32{0}
		GeluForward(1, out, []float32{x})
		want := refGelu(float64(x))
		d := math.Abs(float64(out[0]) - want)
		maxAbs = max(maxAbs, d/max(1, math.Abs(float64(x))))
		if want != 0 {
			maxRel = max(maxRel, d/math.Abs(want))
		}
		if math.Abs(want) > 0.01 {
			maxRelBig = max(maxRelBig, d/math.Abs(want))
		}
	}
	t.Logf("gelu over [-10,10]: max |err|/max(1,|x|) %.3g, max rel error %.3g (%.3g where |gelu| > 0.01)", maxAbs, maxRel, maxRelBig)
	if maxAbs > 2e-7 || maxRel > 2e-5 || maxRelBig > 1e-6 {
		t.Errorf("gelu error too large")
	}
	// Far tails: no NaN, and the exact limits.
	in := []float32{-1e4, -50, 50, 1e4, 0}
	out := make([]float32, len(in))
	GeluForward(1, out, in)
	want := []float32{0, 0, 50, 1e4, 0}
	for i := range in {
		if out[i] != want[i] {
			t.Errorf("gelu(%g) = %g, want %g", in[i], out[i], want[i])
		}
	}
	d := make([]float32, len(in))
	GeluBackward(1, d, in, filled(len(in), 1))
	for i, v := range []float32{0, 0, 1, 1, 0.5} {
		if d[i] != v {
			t.Errorf("gelu'(%g) = %g, want %g", in[i], d[i], v)
		}
	}
}

func TestEncoderForward(t *testing.T) {
	r := newRand(1)
	for _, s := range []struct{ B, T, C, V int }{{1, 1, 1, 1}, {2, 3, 5, 7}, {3, 4, 8, 2}} {
		t.Run(fmt.Sprintf("B%dT%dC%dV%d", s.B, s.T, s.C, s.V), func(t *testing.T) {
			wte, wpe := randSlice(r, s.V*s.C, 1), randSlice(r, (s.T+2)*s.C, 1)
			inp := randTokens(r, s.B*s.T, s.V)
			out := make([]float32, s.B*s.T*s.C)
			EncoderForward(out, inp, wte, wpe, s.B, s.T, s.C)
			want := make([]float64, len(out))
			for bt := 0; bt < s.B*s.T; bt++ {
				for c := 0; c < s.C; c++ {
					want[bt*s.C+c] = float64(wte[int(inp[bt])*s.C+c]) + float64(wpe[(bt%s.T)*s.C+c])
				}
			}
			assertClose(t, "out", out, want, 0, 1e-7)
		})
	}
}

func TestLayerNormForward(t *testing.T) {
	r := newRand(2)
	for _, s := range []struct{ N, C int }{{1, 1}, {1, 2}, {3, 7}, {5, 64}, {4, 771}, {2, 1600}} {
		t.Run(fmt.Sprintf("N%dC%d", s.N, s.C), func(t *testing.T) {
			inp := randSlice(r, s.N*s.C, 3)
			for i := range inp {
				inp[i] += 10 // a large mean, to show the variance does not cancel
			}
			w, b := randSlice(r, s.C, 1), randSlice(r, s.C, 1)
			out, mean, rstd := make([]float32, s.N*s.C), make([]float32, s.N), make([]float32, s.N)
			LayerNormForward(1, out, mean, rstd, inp, w, b, s.N, s.C)
			assertClose(t, "out", out, refLayerNorm(inp, w, b, s.N, s.C), 2e-5, 2e-5)
		})
	}
}

func TestGeluForwardShapes(t *testing.T) {
	r := newRand(3)
	for _, n := range []int{1, 3, 1000} {
		inp := randSlice(r, n, 4)
		out := make([]float32, n)
		GeluForward(1, out, inp)
		want := make([]float64, n)
		for i, x := range inp {
			want[i] = refGelu(float64(x))
		}
		assertClose(t, fmt.Sprint("gelu", n), out, want, 1e-6, 1e-5)
		GeluForward(1, inp, inp) // in place
		assertSame(t, "in place", inp, out)
	}
}

func TestBiasAndResidual(t *testing.T) {
	r := newRand(4)
	for _, s := range []struct{ N, OC int }{{1, 1}, {3, 5}, {7, 300}, {2, 513}} {
		t.Run(fmt.Sprintf("N%dOC%d", s.N, s.OC), func(t *testing.T) {
			x, bias := randSlice(r, s.N*s.OC, 1), randSlice(r, s.OC, 1)
			out := append([]float32(nil), x...)
			AddBias(out, bias, s.N, s.OC)
			want := make([]float64, len(x))
			for i := range x {
				want[i] = float64(x[i]) + float64(bias[i%s.OC])
			}
			assertClose(t, "AddBias", out, want, 0, 1e-7)

			y := randSlice(r, len(x), 1)
			Residual(out, x, y)
			for i := range x {
				want[i] = float64(x[i]) + float64(y[i])
			}
			assertClose(t, "Residual", out, want, 0, 1e-7)
		})
	}
}

func TestCrossEntropyForward(t *testing.T) {
	r := newRand(5)
	for _, s := range []struct {
		N, V  int
		scale float32
	}{{1, 1, 1}, {1, 2, 1}, {4, 7, 3}, {3, 1001, 5}, {2, 50257, 10}, {3, 9, 200}} {
		t.Run(fmt.Sprintf("N%dV%dscale%g", s.N, s.V, s.scale), func(t *testing.T) {
			logits := randSlice(r, s.N*s.V, s.scale)
			targets := randTokens(r, s.N, s.V)
			losses, probs := make([]float32, s.N), make([]float32, s.N*s.V)
			CrossEntropyForward(1, losses, probs, logits, targets, s.N, s.V)
			wantL, wantP := refCrossEntropy(logits, targets, s.N, s.V)
			assertClose(t, "losses", losses, wantL, 1e-6, 1e-6)
			assertClose(t, "probs", probs, wantP, 1e-9, 1e-6)
			// probs may alias logits.
			CrossEntropyForward(1, losses, logits, logits, targets, s.N, s.V)
			assertClose(t, "losses (aliased)", losses, wantL, 1e-6, 1e-6)
			assertSame(t, "probs (aliased)", logits, probs)
		})
	}
}

func TestCrossEntropyStable(t *testing.T) {
	// Logits far beyond exp's range: a naive softmax overflows, and the
	// target's probability underflows float32 while its loss (≈ 1000) must
	// stay finite and exact.
	logits := []float32{1000, -1000, 0, 999}
	losses, probs := make([]float32, 2), make([]float32, 4)
	CrossEntropyForward(1, losses, probs, logits, []int32{1, 0}, 2, 2)
	wantL, wantP := refCrossEntropy(logits, []int32{1, 0}, 2, 2)
	assertClose(t, "losses", losses, wantL, 0, 1e-6)
	assertClose(t, "probs", probs, wantP, 1e-30, 1e-6)
}
