package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestUpdatePartsThreadsMatchesOne: UpdatePartsThreads on 1 to 4
// goroutines leaves the parameters, both moments and the step count bit
// for bit where UpdateParts leaves them, over three steps of parts of odd
// lengths (so that the split points fall inside parts and inside the
// vector loop's blocks of 8, leaving every tail length), with and without
// decay and gradient factors 1 and 0.37, with special gradients (±0,
// subnormal, huge, NaN) mixed in.
func TestUpdatePartsThreadsMatchesOne(t *testing.T) {
	defer func(v int) { minThreadWork = v }(minThreadWork)
	minThreadWork = 1 // every goroutine gets work however few elements
	r := rand.New(rand.NewPCG(13, 17))
	c := Config{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -3e38, float32(math.NaN())}
	lens := []int{1, 7, 0, 33, 9, 61}
	total := 0
	for _, n := range lens {
		total += n
	}
	for threads := 1; threads <= 4; threads++ {
		for _, scale := range []float32{1, 0.37} {
			t.Run(fmt.Sprintf("threads%d/scale%g", threads, scale), func(t *testing.T) {
				p := make([]float32, total)
				for i := range p {
					p[i] = float32(r.NormFloat64())
				}
				want, got := NewAdamW(c, total, nil), NewAdamW(c, total, nil)
				wantP := append([]float32(nil), p...)
				for step := range 3 {
					g := make([]float32, total)
					for i := range g {
						g[i] = float32(r.NormFloat64()) * 1e-2
					}
					g[step*5%total] = special[(step+threads)%len(special)]
					want.UpdateParts(parts(wantP, g, lens), 1e-3, scale)
					got.UpdatePartsThreads(threads, parts(p, g, lens), 1e-3, scale)
				}
				if got.Step != want.Step {
					t.Fatalf("step %d, want %d", got.Step, want.Step)
				}
				for name, pair := range map[string][2][]float32{"p": {p, wantP}, "m": {got.M, want.M}, "v": {got.V, want.V}} {
					for i := range pair[0] {
						if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
							t.Fatalf("%s[%d] = %g, want %g", name, i, pair[0][i], pair[1][i])
						}
					}
				}
			})
		}
	}
}

// parts cuts p and g into runs of lens, every other one decaying, with
// their moments laid out in the same order.
func parts(p, g []float32, lens []int) []Part {
	var out []Part
	at := 0
	for i, n := range lens {
		out = append(out, Part{P: p[at : at+n], G: g[at : at+n], At: at, Decay: i%2 == 1})
		at += n
	}
	return out
}
