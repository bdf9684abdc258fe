package zero

import (
	"fmt"
	"math"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// TestEmbeddingDecodedOncePerStep: at stages 0–2 with 16-bit parameters
// the embedding unit is decoded once and then served from the same
// buffer for the rest of the step (a mark written into it survives a
// Release and the next Weights: nothing decoded it again), and after a
// step, whose update changes the working parameters, Weights(0) is their
// new decoding, bit for bit, not the old one.
func TestEmbeddingDecodedOncePerStep(t *testing.T) {
	for _, dt := range []comm.DType{comm.BFloat16, comm.Float16} {
		for stage := range 3 {
			t.Run(fmt.Sprintf("%s/stage%d", dt, stage), func(t *testing.T) {
				flat := make([]float32, testCfg.NumParams())
				model.InitParams(testCfg, 1, flat)
				cfg := Config{Stage: stage, Params: dt, Grads: dt, FirstBucket: 300, Bucket: 700,
					Optim: optim.Config{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
				e, err := New(cfg, testCfg, nil, flat)
				if err != nil {
					t.Fatal(err)
				}
				lo, hi := e.unitRange(0)
				for step := range 3 {
					want := make([]float32, hi-lo)
					decode(want, e.work.Slice(lo, hi))
					w := e.Weights(0)
					for i := range w {
						if math.Float32bits(w[i]) != math.Float32bits(want[i]) {
							t.Fatalf("step %d: embedding %d is %v, the working parameter %v", step, i, w[i], want[i])
						}
					}
					w[0] = 12345 // what the model never writes: a mark
					e.Release(0)
					if got := e.Weights(0)[0]; got != 12345 {
						t.Fatalf("step %d: the second Weights(0) decoded again (%v)", step, got)
					}
					e.Release(0)
					e.BeginMicro(0, 1)
					for u := len(e.units) - 1; u >= 0; u-- {
						g := e.Grads(u)
						for i := range g {
							g[i] = 0.5
						}
						e.GradsDone(u)
					}
					if _, err := e.Step(1e-2); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}
