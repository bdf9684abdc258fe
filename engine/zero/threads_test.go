package zero

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// specials are gradients and parameters the conversions must keep bit
// for bit: signed zeros (0 + -0 is +0), the smallest and a rounding
// subnormal, a tie that rounds to even in bfloat16, the largest finite
// value (rounds to Inf in both half types), infinities and a NaN.
var specials = []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -1.5e-39,
	math.Float32frombits(0x3f808000), math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}

// values is n normal values with specials scattered among them.
func values(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
		if r.IntN(5) == 0 {
			v[i] = specials[r.IntN(len(specials))]
		}
	}
	return v
}

func sameBits(a, b []byte) bool { return slices.Equal(a, b) }

// TestStoreMatchesAccumulate: store, which rounds a micro-batch's
// gradients into zeroed low-precision gradients without reading them,
// gives the bits accumulate gives adding them to zeros (-0 included:
// accumulate's 0 + -0 is +0), in every type, at every length up to two
// chunks and a bit (every tail of the chunk loop and of the SIMD
// conversions).
func TestStoreMatchesAccumulate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Float16} {
		for n := range 2*chunk + 40 {
			src := values(r, n)
			if n > 0 { // at least one -0 wherever the specials fell
				src[r.IntN(n)] = float32(math.Copysign(0, -1))
			}
			want, got := comm.NewBuffer(dt, n), comm.NewBuffer(dt, n)
			accumulate(want, src)
			store(got, src)
			if !sameBits(got.Bytes(), want.Bytes()) {
				t.Fatalf("%s, %d values: store differs from accumulate into zeros", dt, n)
			}
		}
	}
}

// TestSpreadPassesMatchOneThread: the engine's passes on 2 to 4
// goroutines (every range one element or more) leave the bits one
// goroutine leaves, at odd lengths and with special values.
func TestSpreadPassesMatchOneThread(t *testing.T) {
	defer func(v int) { minSpread = v }(minSpread)
	minSpread = 1
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Float16} {
		for _, n := range []int{0, 1, 3, 7, 31, 513, 1031} {
			for threads := 2; threads <= 4; threads++ {
				t.Run(fmt.Sprintf("%s/n%d/threads%d", dt, n, threads), func(t *testing.T) {
					one, many := &Engine{cfg: Config{Threads: 1}}, &Engine{cfg: Config{Threads: threads}}
					src, add := values(r, n), values(r, n)
					b1, bn := comm.NewBuffer(dt, n), comm.NewBuffer(dt, n)
					one.encodeAll(b1, src)
					many.encodeAll(bn, src)
					check(t, "encode", bn.Bytes(), b1.Bytes())
					one.accumulateAll(b1, add, false)
					many.accumulateAll(bn, add, false)
					check(t, "accumulate", bn.Bytes(), b1.Bytes())
					f1, fn := make([]float32, n), make([]float32, n)
					one.decodeAll(f1, b1)
					many.decodeAll(fn, bn)
					check(t, "decode", comm.F32(fn).Bytes(), comm.F32(f1).Bytes())
					one.clearAll(b1)
					many.accumulateAll(bn, add, true)
					one.accumulateAll(b1, add, false)
					check(t, "fresh accumulate", bn.Bytes(), b1.Bytes())
					many.clearAll(bn)
					if slices.ContainsFunc(bn.Bytes(), func(b byte) bool { return b != 0 }) {
						t.Fatalf("clear left bytes set")
					}
				})
			}
		}
	}
}

func check(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !sameBits(got, want) {
		t.Fatalf("%s: bits differ from one goroutine's", what)
	}
}

// TestLowPrecisionGradsAccumulate: with bf16 gradients at stages 0 and
// 1, the first micro-batch of a step overwrites the zeroed gradients
// (store) and the next ones add to them; over three steps of two
// micro-batches, on 1 and 3 goroutines, the gradients after each
// micro-batch are, bit for bit, the old path's: accumulate into the
// zeroed buffer every time. A unit left fresh after its first
// micro-batch would be overwritten by the second.
func TestLowPrecisionGradsAccumulate(t *testing.T) {
	defer func(v int) { minSpread = v }(minSpread)
	minSpread = 1
	r := rand.New(rand.NewPCG(5, 6))
	n := testCfg.NumParams()
	for _, stage := range []int{0, 1} {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("stage%d/threads%d", stage, threads), func(t *testing.T) {
				flat := make([]float32, n)
				model.InitParams(testCfg, 1, flat)
				cfg := Config{Stage: stage, Params: comm.BFloat16, Grads: comm.BFloat16, FirstBucket: 300, Bucket: 700, Threads: threads,
					Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
				e, err := New(cfg, testCfg, nil, flat)
				if err != nil {
					t.Fatal(err)
				}
				want := comm.NewBuffer(comm.BFloat16, n)
				for step := range 3 {
					for micro := range 2 {
						e.BeginMicro(micro, 2)
						for u := len(e.units) - 1; u >= 0; u-- {
							g := e.Grads(u)
							copy(g, values(r, len(g)))
							for i := range g { // a NaN or Inf would end the step
								if math.IsNaN(float64(g[i])) || math.IsInf(float64(g[i]), 0) || math.Abs(float64(g[i])) > 1e30 {
									g[i] = float32(math.Copysign(0, -1))
								}
							}
							lo, hi := e.unitRange(u)
							accumulate(want.Slice(lo, hi), g)
							e.GradsDone(u)
						}
						if !sameBits(e.grads.Bytes(), want.Bytes()) {
							t.Fatalf("step %d, micro-batch %d: gradients differ from accumulating into zeros", step, micro)
						}
					}
					if _, err := e.Step(1e-3); err != nil {
						t.Fatal(err)
					}
					clear(want.Bytes())
				}
			})
		}
	}
}

// TestStepDecodesAsScratch: the step over 16-bit gradients, which decodes
// them a block at a time for the norm and for AdamW (on 1 and 3
// goroutines), gives the norm, master weights and moments, bit for bit,
// of the step it replaced: every owned gradient decoded into an fp32 copy,
// its squares summed piece by piece, then UpdateParts with the clip
// factor, then the working parameters rounded from the masters; in bf16
// and fp16, with 16-bit and fp32 gradients, at every stage, over three
// clipped steps, with blocks of 7 (most pieces end in a short block).
func TestStepDecodesAsScratch(t *testing.T) {
	defer func(v, b int) { minSpread, blockLen = v, b }(minSpread, blockLen)
	minSpread, blockLen = 1, 7
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct{ params, grads comm.DType }{{comm.BFloat16, comm.BFloat16}, {comm.Float16, comm.Float16}, {comm.BFloat16, comm.Float32}} {
		for stage := range 4 {
			for _, threads := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s-%s/stage%d/threads%d", c.params, c.grads, stage, threads), func(t *testing.T) {
					flat := make([]float32, testCfg.NumParams())
					model.InitParams(testCfg, 1, flat)
					cfg := Config{Stage: stage, Params: c.params, Grads: c.grads, FirstBucket: 300, Bucket: 700, Threads: threads,
						Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1e-9}}
					e, err := New(cfg, testCfg, nil, flat)
					if err != nil {
						t.Fatal(err)
					}
					ref := optim.NewAdamW(cfg.Optim, e.part.Size(), nil)
					master := slices.Clone(e.master)
					for step := range 3 {
						e.BeginMicro(0, 1)
						for u := len(e.units) - 1; u >= 0; u-- {
							g := e.Grads(u)
							for i := range g {
								g[i] = float32(r.NormFloat64()) * 1e-2
							}
							g[0], g[len(g)-1] = float32(math.Copysign(0, -1)), 1.5e-39
							e.GradsDone(u)
						}
						want, wantNorm := refStep(e, ref, master, step)
						res, err := e.Step(1e-3)
						if err != nil {
							t.Fatal(err)
						}
						if res.Norm != wantNorm || res.NonFinite {
							t.Fatalf("step %d: norm %v (non-finite %v), want %v", step, res.Norm, res.NonFinite, wantNorm)
						}
						for name, pair := range map[string][2][]float32{"master": {e.master, want}, "m": {e.opt.M, ref.M}, "v": {e.opt.V, ref.V}} {
							check(t, name, comm.F32(pair[0]).Bytes(), comm.F32(pair[1]).Bytes())
						}
						for _, pc := range e.pieces {
							w := comm.NewBuffer(c.params, pc.n)
							encode(w, want[pc.at:pc.at+pc.n])
							check(t, "working parameters", e.workOf(pc).Bytes(), w.Bytes())
						}
					}
				})
			}
		}
	}
}

// refStep is the step before blockwise decoding, on copies (master, ref)
// of the engine's state: it returns the updated master and the norm.
func refStep(e *Engine, ref *optim.AdamW, master []float32, step int) ([]float32, float64) {
	scratch := make([]float32, e.part.Size())
	for _, pc := range e.pieces {
		decode(scratch[pc.at:pc.at+pc.n], e.gradBuf(pc)) // a copy when fp32
	}
	var sq squares
	for _, pc := range e.pieces {
		sq.add(scratch[pc.at : pc.at+pc.n])
	}
	norm := sq.norm() / e.scaler.Scale
	factor := 1 / e.scaler.Scale * optim.ClipScale(norm, e.cfg.Optim.GradClip)
	if step == 0 && factor == 1/e.scaler.Scale {
		panic("the test's gradients are not clipped")
	}
	var parts []optim.Part
	for _, pc := range e.pieces {
		parts = append(parts, optim.Part{P: master[pc.at : pc.at+pc.n], G: scratch[pc.at : pc.at+pc.n], At: pc.at, Decay: pc.param.Decay})
	}
	ref.UpdateParts(parts, 1e-3, float32(factor))
	return master, norm
}
