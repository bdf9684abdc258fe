package zero

import (
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// BenchmarkTrainStep times whole training steps of one rank (forward,
// backward, Step) on the presets of docs/bench/bf16.sh, fp32 and bf16
// side by side, 2 threads: what the engine adds to the model under each
// precision shows in a CPU profile of it.
func BenchmarkTrainStep(b *testing.B) {
	for _, tc := range []struct {
		preset string
		B, T   int
	}{{"small", 8, 256}, {"gpt2", 1, 1024}} {
		for _, prec := range []comm.DType{comm.Float32, comm.BFloat16} {
			b.Run(fmt.Sprintf("%s/%s", tc.preset, prec), func(b *testing.B) {
				benchTrainStep(b, tc.preset, tc.B, tc.T, prec)
			})
		}
	}
}

func benchTrainStep(b *testing.B, preset string, B, T int, prec comm.DType) {
	cfg := model.Presets[preset]
	flat := make([]float32, cfg.NumParams())
	model.InitParams(cfg, 1, flat)
	zc := Config{Params: prec, Grads: prec, FirstBucket: 1 << 18, Bucket: 25 << 18, Threads: 2,
		Optim: optim.Config{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}}
	e, err := New(zc, cfg, nil, flat)
	if err != nil {
		b.Fatal(err)
	}
	be := backend.CPU{Threads: 2, MatmulBF16: prec == comm.BFloat16}
	m, err := model.NewWithStore(cfg, B, T, be, "", e)
	if err != nil {
		b.Fatal(err)
	}
	x, y := make([]int32, B*T), make([]int32, B*T)
	for i := range x {
		x[i], y[i] = int32(i*7%cfg.Vocab), int32((i*7+3)%cfg.Vocab)
	}
	step := func() {
		e.BeginMicro(0, 1)
		if _, err := m.Forward(x, y); err != nil {
			b.Fatal(err)
		}
		m.Backward(1)
		if _, err := e.Step(1e-4); err != nil {
			b.Fatal(err)
		}
	}
	step()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(B*T*b.N)/b.Elapsed().Seconds(), "tok/s")
}

// BenchmarkEngineStep times what the engine itself does in a step of one
// rank, without the model's compute: every Weights and Release of
// forward and backward, Grads and GradsDone of every unit, and Step
// (norm, AdamW, publishing the update), on the presets' parameter counts,
// 2 threads.
func BenchmarkEngineStep(b *testing.B) {
	for _, preset := range []string{"small", "gpt2"} {
		for _, prec := range []comm.DType{comm.Float32, comm.BFloat16} {
			b.Run(fmt.Sprintf("%s/%s", preset, prec), func(b *testing.B) {
				cfg := model.Presets[preset]
				flat := make([]float32, cfg.NumParams())
				model.InitParams(cfg, 1, flat)
				zc := Config{Params: prec, Grads: prec, FirstBucket: 1 << 18, Bucket: 25 << 18, Threads: 2,
					Optim: optim.Config{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}}
				e, err := New(zc, cfg, nil, flat)
				if err != nil {
					b.Fatal(err)
				}
				units := len(cfg.Units())
				step := func() {
					e.BeginMicro(0, 1)
					for u := range units { // forward, then the tied output layer
						e.Weights(u)
						e.Release(u)
					}
					e.Weights(0)
					e.Release(0)
					for u := units - 1; u >= 0; u-- { // backward: the embeddings first, done last
						e.Weights(u)
						g := e.Grads(u)
						g[0] = 1e-3
						e.GradsDone(u)
						e.Release(u)
					}
					if _, err := e.Step(1e-4); err != nil {
						b.Fatal(err)
					}
				}
				step()
				b.ResetTimer()
				for range b.N {
					step()
				}
			})
		}
	}
}
