package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refUpdateParts is UpdateParts as it was written before the vector loop,
// one element at a time (products converted to float32 explicitly, so
// that no compiler fuses them).
func refUpdateParts(o *AdamW, parts []Part, lr float64, gradScale float32) {
	o.Step++
	c := o.Config
	b1, b2 := float32(c.Beta1), float32(c.Beta2)
	bc1 := float32(1 - math.Pow(c.Beta1, float64(o.Step)))
	bc2 := float32(1 - math.Pow(c.Beta2, float64(o.Step)))
	stepSize := float32(lr) / bc1
	sqrtBC2 := float32(math.Sqrt(float64(bc2)))
	eps := float32(c.Eps)
	for _, pt := range parts {
		decay := float32(1)
		if pt.Decay {
			decay = float32(1 - lr*c.WeightDecay)
		}
		p, gr := pt.P, pt.G[:len(pt.P)]
		m := o.M[pt.At : pt.At+len(p)]
		v := o.V[pt.At : pt.At+len(p)]
		for i := range p {
			gi := gr[i]
			if gradScale != 1 {
				gi *= gradScale
			}
			mi := float32(b1*m[i]) + float32((1-b1)*gi)
			vi := float32(b2*v[i]) + float32(float32((1-b2)*gi)*gi)
			m[i], v[i] = mi, vi
			denom := sqrt32(vi)/sqrtBC2 + eps
			p[i] = float32(p[i]*decay) - float32(stepSize*mi)/denom
		}
	}
}

// TestAdamWVectorMatchesGo: UpdateParts (the AVX2 loop where the CPU has
// it, Go for the tails) leaves the parameters and both moments bit for bit
// where the scalar update leaves them, over three steps of parts of every
// length from 0 to 40 at odd offsets, with and without weight decay, with
// a gradient factor of 1 and of 0.37, and with zero, tiny and huge
// gradients mixed in.
func TestAdamWVectorMatchesGo(t *testing.T) {
	if !useAVX2AdamW {
		t.Logf("no AVX2 (or -race): this checks the Go loop alone")
	}
	r := rand.New(rand.NewPCG(7, 11))
	c := Config{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	for _, scale := range []float32{1, 0.37} {
		for n := range 41 {
			t.Run(fmt.Sprintf("scale%g/n%d", scale, n), func(t *testing.T) {
				const at = 3 // the parts start at odd offsets of P, G, M and V
				total := at + 2*n + 1
				params, grads := randVec(r, total), make([]float32, total)
				got, want := NewAdamW(c, total, nil), NewAdamW(c, total, nil)
				gotP := append([]float32(nil), params...)
				for step := range 3 {
					for i := range grads {
						grads[i] = float32(r.NormFloat64()) * 1e-2
						switch r.IntN(8) {
						case 0:
							grads[i] = 0
						case 1:
							grads[i] = 1e-30
						case 2:
							grads[i] = -1e15
						}
					}
					split := func(p []float32) []Part {
						return []Part{{P: p[at : at+n], G: grads[at : at+n], At: at, Decay: true},
							{P: p[at+n : at+2*n+1], G: grads[at+n : at+2*n+1], At: at + n, Decay: false}}
					}
					lr := c.LR * float64(step+1) / 3
					got.UpdateParts(split(gotP), lr, scale)
					refUpdateParts(want, split(params), lr, scale)
					for i := range params {
						for _, s := range []struct {
							name string
							a, b float32
						}{{"param", gotP[i], params[i]}, {"m", got.M[i], want.M[i]}, {"v", got.V[i], want.V[i]}} {
							if math.Float32bits(s.a) != math.Float32bits(s.b) {
								t.Fatalf("step %d: %s[%d] = %g, want %g", step+1, s.name, i, s.a, s.b)
							}
						}
					}
				}
			})
		}
	}
}

func randVec(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// BenchmarkAdamW runs the update of the small preset's 10.7M parameters
// with the Go loop and with adamwUpdate (the vector loop where there is
// one), side by side.
func BenchmarkAdamW(b *testing.B) {
	const n = 10_700_000
	r := rand.New(rand.NewPCG(1, 2))
	p, g, m, v := randVec(r, n), randVec(r, n), make([]float32, n), make([]float32, n)
	k := adamwK{scale: 1, b1: 0.9, omb1: 0.1, b2: 0.95, omb2: 0.05, sqrtBC2: 0.5, eps: 1e-8, decay: 0.9999, stepSize: 1e-3}
	for _, c := range []struct {
		name string
		f    func(p, g, m, v []float32, k *adamwK)
	}{{"go", adamwGo}, {"update", adamwUpdate}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(7 * 4 * n) // p, g, m, v read; p, m, v written
			for b.Loop() {
				c.f(p, g, m, v, &k)
			}
		})
	}
}
