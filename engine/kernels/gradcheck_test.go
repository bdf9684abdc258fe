package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Gradient checks. Each op's loss is L = Σ out·w with fixed random w (so
// dout = w), or the mean cross-entropy, computed in float64 from the
// kernel's float32 outputs; the analytic gradient from the backward kernel
// is compared with the central difference (L(x+h) - L(x-h)) / 2h.
//
// Step: h = 1e-2 on inputs of order 1. The truncation error of the central
// difference is h²/6 times the third derivative, about 2e-5·|L⁽³⁾|; the
// ops' third derivatives are of order one (gradTruncTol allows |L⁽³⁾| up to
// 6, gradRelTol covers larger curvature on large gradients).
//
// Rounding: an output the perturbation changes carries a float32 error of
// a few ulp, so L(x±h) is off by up to gradUlps·2⁻²⁴·Σ|out·w| over those
// outputs (the outputs it leaves alone are bit-for-bit unchanged and cancel
// exactly); divided by 2h that is the noise term of the tolerance, computed
// per coordinate. A wrong gradient (a missing term, a wrong factor, a
// transposed index) is off by the order of the gradient itself, far above
// these bounds.
const (
	gradStep     = 1e-2
	gradUlps     = 8
	gradTruncTol = 1e-4
	gradRelTol   = 1e-3
	gradMaxCoord = 150 // coordinates checked per tensor, chosen at random beyond that
)

// gradTarget is one differentiable input x of an op and the analytic
// gradient of L with respect to it.
type gradTarget struct {
	name    string
	x, grad []float32
}

// gradCheck perturbs coordinates of each target and compares the central
// difference of L = Σ eval()·w with the analytic gradient. eval recomputes
// the op's outputs from the current inputs.
func gradCheck(t *testing.T, r *rand.Rand, eval func() []float32, w []float32, targets ...gradTarget) {
	t.Helper()
	base := slices.Clone(eval())
	for _, tg := range targets {
		if !slices.ContainsFunc(tg.grad, func(g float32) bool { return g != 0 }) {
			t.Fatalf("%s: analytic gradient is all zero; the check would prove nothing", tg.name)
		}
		var worst float64
		for _, i := range gradCoords(r, len(tg.x)) {
			fd, noise := centralDiff(eval, base, w, tg.x, i)
			g := float64(tg.grad[i])
			tol := noise + gradTruncTol + gradRelTol*math.Abs(g)
			worst = max(worst, math.Abs(fd-g)/tol)
			if !(math.Abs(fd-g) <= tol) {
				t.Errorf("%s[%d]: analytic %.6g, finite difference %.6g (tol %.3g)", tg.name, i, g, fd, tol)
			}
		}
		t.Logf("%s: worst |error|/tolerance %.3f", tg.name, worst)
	}
}

// gradCoords returns the coordinates to check in a tensor of n values: all
// of them, or gradMaxCoord random ones including the first and the last.
func gradCoords(r *rand.Rand, n int) []int {
	if n <= gradMaxCoord {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	idx := []int{0, n - 1}
	for len(idx) < gradMaxCoord {
		idx = append(idx, r.IntN(n))
	}
	return idx
}

// centralDiff returns the central difference of Σ eval()·w in x[i] and
// the rounding-noise bound on it, restoring x[i] afterwards.
func centralDiff(eval func() []float32, base, w, x []float32, i int) (fd, noise float64) {
	orig := x[i]
	x[i] = orig + gradStep
	plus := slices.Clone(eval())
	x[i] = orig - gradStep
	minus := eval()
	// The step actually taken, after rounding x±h to float32.
	step := float64(orig+gradStep) - float64(orig-gradStep)
	x[i] = orig
	var diff, touched float64
	for k := range base {
		if plus[k] == base[k] && minus[k] == base[k] {
			continue
		}
		diff += (float64(plus[k]) - float64(minus[k])) * float64(w[k])
		touched += (math.Abs(float64(plus[k])) + math.Abs(float64(minus[k]))) * math.Abs(float64(w[k]))
	}
	return diff / step, gradUlps * 0x1p-24 * touched / step
}

func TestGradEncoder(t *testing.T) {
	r := newRand(20)
	B, T, C, V := 2, 4, 5, 3 // 8 positions over 3 tokens: rows repeat
	wte, wpe := randSlice(r, V*C, 1), randSlice(r, T*C, 1)
	inp := randTokens(r, B*T, V)
	out, w := make([]float32, B*T*C), randSlice(r, B*T*C, 1)
	dwte, dwpe := make([]float32, len(wte)), make([]float32, len(wpe))
	EncoderBackward(dwte, dwpe, w, inp, B, T, C)
	eval := func() []float32 { EncoderForward(out, inp, wte, wpe, B, T, C); return out }
	gradCheck(t, r, eval, w, gradTarget{"wte", wte, dwte}, gradTarget{"wpe", wpe, dwpe})
}

func TestGradLayerNorm(t *testing.T) {
	r := newRand(21)
	for _, s := range []struct{ N, C int }{{1, 2}, {3, 7}, {4, 64}, {2, 301}} {
		t.Run(fmt.Sprintf("N%dC%d", s.N, s.C), func(t *testing.T) {
			N, C := s.N, s.C
			inp, weight, bias := randSlice(r, N*C, 2), randSlice(r, C, 1), randSlice(r, C, 1)
			out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
			w := randSlice(r, N*C, 1)
			eval := func() []float32 {
				LayerNormForward(1, out, mean, rstd, inp, weight, bias, N, C)
				return out
			}
			eval()
			dinp, dw, db := make([]float32, N*C), make([]float32, C), make([]float32, C)
			LayerNormBackward(1, dinp, dw, db, w, inp, weight, mean, rstd, N, C)
			gradCheck(t, r, eval, w, gradTarget{"inp", inp, dinp}, gradTarget{"weight", weight, dw}, gradTarget{"bias", bias, db})
		})
	}
}

func TestGradGelu(t *testing.T) {
	r := newRand(22)
	inp := randSlice(r, 300, 5)
	out, w, dinp := make([]float32, len(inp)), randSlice(r, len(inp), 1), make([]float32, len(inp))
	GeluBackward(1, dinp, inp, w)
	eval := func() []float32 { GeluForward(1, out, inp); return out }
	gradCheck(t, r, eval, w, gradTarget{"inp", inp, dinp})
}

func TestGradBiasAndResidual(t *testing.T) {
	r := newRand(23)
	N, OC := 6, 11
	x, bias, y := randSlice(r, N*OC, 1), randSlice(r, OC, 1), randSlice(r, N*OC, 1)
	out, w, dbias := make([]float32, N*OC), randSlice(r, N*OC, 1), make([]float32, OC)
	BiasBackward(dbias, w, N, OC)
	// Both ops pass the gradient through unchanged to their other inputs.
	eval := func() []float32 { copy(out, x); AddBias(out, bias, N, OC); return out }
	gradCheck(t, r, eval, w, gradTarget{"bias", bias, dbias}, gradTarget{"x", x, w})
	eval = func() []float32 { Residual(out, x, y); return out }
	gradCheck(t, r, eval, w, gradTarget{"a", x, w}, gradTarget{"b", y, w})
}

func TestGradAttention(t *testing.T) {
	r := newRand(24)
	for _, s := range attnShapes {
		t.Run(fmt.Sprintf("B%dT%dC%dNH%d", s.B, s.T, s.C, s.NH), func(t *testing.T) {
			B, T, C, NH := s.B, s.T, s.C, s.NH
			qkv := randSlice(r, B*T*3*C, 1)
			out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
			w := randSlice(r, B*T*C, 1)
			eval := func() []float32 { AttentionForward(1, out, att, qkv, B, T, C, NH); return out }
			eval()
			dqkv := make([]float32, len(qkv))
			AttentionBackward(1, dqkv, w, qkv, att, make([]float32, AttentionScratch(1, T)), B, T, C, NH)
			gradCheck(t, r, eval, w, gradTarget{"qkv", qkv, dqkv})
		})
	}
}

func TestGradCrossEntropy(t *testing.T) {
	r := newRand(25)
	for _, s := range []struct{ N, V int }{{1, 2}, {3, 5}, {4, 300}} {
		t.Run(fmt.Sprintf("N%dV%d", s.N, s.V), func(t *testing.T) {
			N, V := s.N, s.V
			logits, targets := randSlice(r, N*V, 3), randTokens(r, N, V)
			losses, probs := make([]float32, N), make([]float32, N*V)
			w := filled(N, 1/float32(N)) // L is the mean loss
			eval := func() []float32 {
				CrossEntropyForward(1, losses, probs, logits, targets, N, V)
				return losses
			}
			eval()
			dlogits := make([]float32, N*V)
			CrossEntropyBackward(1, dlogits, probs, targets, 1/float32(N), N, V)
			gradCheck(t, r, eval, w, gradTarget{"logits", logits, dlogits})
		})
	}
}
