package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// elemInputs is n values for the element-wise loops: mostly GELU's range
// of interest, with the far tails (where e^(-2u) overflows), zeros of both
// signs, subnormals, huge values and infinities mixed in.
func elemInputs(r *rand.Rand, n int) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, 1e30, -1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), -9.6, -20, 20, 3e-3}
	x := randSlice(r, n, 6)
	for i := range x {
		if r.IntN(5) == 0 {
			x[i] = special[r.IntN(len(special))]
		}
	}
	return x
}

// sameBits is a bit-for-bit comparison that also takes any NaN for any
// other (a NaN's sign and payload are not part of the contract).
func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// TestElementwiseMatchesGo: the element-wise loops (the AVX2 assembly where
// the CPU has it, with the Go tail) give the very bits of the scalar
// formulas GeluForward, GeluBackward and BiasBackward used before them,
// every product rounded to float32 in the written order, on every length
// from 0 to 80 (every tail of the 8-lane loop) and at every offset from
// an aligned start.
func TestElementwiseMatchesGo(t *testing.T) {
	if !useAVX2Elem {
		t.Logf("no AVX2 (or -race): this checks the Go loops alone")
	}
	r := newRand(90)
	for n := range 81 {
		for off := range 3 {
			t.Run(fmt.Sprintf("n%d/off%d", n, off), func(t *testing.T) {
				x := elemInputs(r, n+off)[off:]
				e := make([]float32, n+off)[off:]
				geluArg(e, x)
				for i, v := range x {
					want := float32(-2*geluS) * (v + float32(float32(float32(geluC)*v)*v)*v)
					if !sameBits(e[i], want) {
						t.Fatalf("geluArg(%g)[%d] = %g, want %g", v, i, e[i], want)
					}
				}
				expInPlace(e)
				o := make([]float32, n+off)[off:]
				geluOut(o, x, e)
				d := elemInputs(r, n)
				di := randSlice(r, n, 1)
				want := append([]float32(nil), di...)
				geluGradOut(di, x, e, d)
				for i, v := range x {
					if w := v / (1 + e[i]); !sameBits(o[i], w) {
						t.Fatalf("geluOut(%g)[%d] = %g, want %g", v, i, o[i], w)
					}
					sig := 1 / (1 + e[i])
					du := float32(geluS) * (1 + float32(float32(float32(3*geluC)*v)*v))
					want[i] += float32((sig + float32(float32(float32(2*v)*sig)*(1-sig))*du) * d[i])
					if !sameBits(di[i], want[i]) {
						t.Fatalf("geluGradOut(x %g, d %g)[%d] = %g, want %g", v, d[i], i, di[i], want[i])
					}
				}
				acc := make([]float64, n)
				wantAcc := make([]float64, n)
				for range 3 {
					addF64(acc, x)
					for i, v := range x {
						wantAcc[i] += float64(v)
					}
				}
				for i := range acc {
					if math.Float64bits(acc[i]) != math.Float64bits(wantAcc[i]) && !(acc[i] != acc[i] && wantAcc[i] != wantAcc[i]) {
						t.Fatalf("addF64[%d] = %g, want %g", i, acc[i], wantAcc[i])
					}
				}
			})
		}
	}
}

// TestBiasResidualThreadsMatchScalar: AddBiasThreads, ResidualThreads and
// BiasBackwardThreads (vector loops, rows, elements or columns shared among
// 1-3 goroutines) give the bits of the scalar loops they replace, on
// widths around the 8-lane loop and BiasBackward's 256-column block, and
// AddBias, Residual and BiasBackward give the same.
func TestBiasResidualThreadsMatchScalar(t *testing.T) {
	lowerParallelThreshold(t)
	r := newRand(91)
	const N = 5
	for _, OC := range []int{1, 7, 8, 13, 37, 256, 300, 517} {
		bias, x, y := elemInputs(r, OC), elemInputs(r, N*OC), elemInputs(r, N*OC)
		wantBias, wantRes := make([]float32, N*OC), make([]float32, N*OC)
		wantDB := randSlice(r, OC, 1)
		db0 := append([]float32(nil), wantDB...)
		for c := range OC {
			var s float64
			for n := range N {
				i := n*OC + c
				wantBias[i] = x[i] + bias[c]
				wantRes[i] = x[i] + y[i]
				s += float64(y[i])
			}
			wantDB[c] += float32(s)
		}
		for threads := 1; threads <= 3; threads++ {
			t.Run(fmt.Sprintf("OC%d/t%d", OC, threads), func(t *testing.T) {
				check := func(name string, got, want []float32) {
					t.Helper()
					for i := range want {
						if !sameBits(got[i], want[i]) {
							t.Fatalf("%s[%d] = %g, want %g", name, i, got[i], want[i])
						}
					}
				}
				out := append([]float32(nil), x...)
				AddBiasThreads(threads, out, bias, N, OC)
				check("AddBiasThreads", out, wantBias)
				out = append(out[:0], x...)
				AddBias(out, bias, N, OC)
				check("AddBias", out, wantBias)
				ResidualThreads(threads, out, x, y)
				check("ResidualThreads", out, wantRes)
				Residual(out, x, y)
				check("Residual", out, wantRes)
				db := append([]float32(nil), db0...)
				BiasBackwardThreads(threads, db, y, N, OC)
				check("BiasBackwardThreads", db, wantDB)
				db = append(db[:0], db0...)
				BiasBackward(db, y, N, OC)
				check("BiasBackward", db, wantDB)
			})
		}
	}
}

// TestLayerNormLoopsMatchGo: the layer norm's element-wise loops (output,
// input gradient, parameter gradients) give the bits of the scalar
// formulas LayerNormForward and LayerNormBackward used before them, on
// every length from 0 to 80 and at odd offsets.
func TestLayerNormLoopsMatchGo(t *testing.T) {
	r := newRand(92)
	m, s, gMean, gxMean := float32(0.37), float32(1.9), float32(-0.021), float32(0.45)
	for n := range 81 {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			const off = 1
			x, w, b, d := elemInputs(r, n+off)[off:], randSlice(r, n, 2), randSlice(r, n, 1), elemInputs(r, n)
			o := make([]float32, n+off)[off:]
			lnOut(o, x, w, b, m, s)
			di, dw, db := randSlice(r, n, 1), randSlice(r, n, 1), randSlice(r, n, 1)
			wantDi, wantDw, wantDb := append([]float32(nil), di...), append([]float32(nil), dw...), append([]float32(nil), db...)
			lnGradOut(di, x, w, d, m, s, gMean, gxMean)
			lnParamGrad(dw, db, d, x, m, s)
			for i, xi := range x {
				xhat := float32((xi - m) * s)
				if want := float32(xhat*w[i]) + b[i]; !sameBits(o[i], want) {
					t.Fatalf("lnOut[%d] = %g, want %g", i, o[i], want)
				}
				wantDi[i] += float32((float32(float32(w[i]*d[i])-gMean) - float32(xhat*gxMean)) * s)
				wantDb[i] += d[i]
				wantDw[i] += float32(xhat * d[i])
				for _, c := range []struct {
					name      string
					got, want float32
				}{{"lnGradOut", di[i], wantDi[i]}, {"dweight", dw[i], wantDw[i]}, {"dbias", db[i], wantDb[i]}} {
					if !sameBits(c.got, c.want) {
						t.Fatalf("%s[%d] = %g, want %g (x %g, d %g)", c.name, i, c.got, c.want, xi, d[i])
					}
				}
			}
		})
	}
}

// TestSoftmaxLoopsMatchGo: the softmax's element-wise loops (subtract the
// maximum, scale by the sum's reciprocal, the gradient p·(g - dot)) give
// the bits of the scalar loops they replace, on every length from 1 to 80
// (every tail) and at an odd offset.
func TestSoftmaxLoopsMatchGo(t *testing.T) {
	r := newRand(93)
	for n := 1; n <= 80; n++ {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			x, y := elemInputs(r, n+1)[1:], randSlice(r, n, 2)
			c := y[0]
			sub, mul, g := append([]float32(nil), x...), append([]float32(nil), x...), append([]float32(nil), y...)
			subScalar(sub, c)
			mulScalar(mul, c)
			softmaxGrad(g, x, c)
			for i, v := range x {
				if !sameBits(sub[i], v-c) || !sameBits(mul[i], v*c) || !sameBits(g[i], v*(y[i]-c)) {
					t.Fatalf("[%d]: sub %g, mul %g, grad %g; want %g, %g, %g", i, sub[i], mul[i], g[i], v-c, v*c, v*(y[i]-c))
				}
			}
		})
	}
}
