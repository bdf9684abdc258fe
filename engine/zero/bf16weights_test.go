package zero

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// decodingStore is the engine without WeightsBF16: the model asks it for
// every unit in float32, decoded, as before the engine lent its bf16
// working parameters.
type decodingStore struct{ e *Engine }

func (s decodingStore) Weights(u int) []float32 { return s.e.Weights(u) }
func (s decodingStore) Release(u int)           { s.e.Release(u) }
func (s decodingStore) Prefetch(u int)          { s.e.Prefetch(u) }
func (s decodingStore) Grads(u int) []float32   { return s.e.Grads(u) }
func (s decodingStore) GradsDone(u int)         { s.e.GradsDone(u) }

// countingStore is the engine, counting the units it decodes for the
// model (Weights).
type countingStore struct {
	*Engine
	decoded map[int]int
}

func (s *countingStore) Weights(u int) []float32 {
	s.decoded[u]++
	return s.Engine.Weights(u)
}

// TestBF16WeightsInPlace: with bf16 working parameters and bf16 matmuls
// the model multiplies by the engine's bf16 matrices in place and decodes
// only the final LayerNorm's unit (its vectors are the only parameters
// not in a block or the embeddings), at every stage; the losses and
// gradient norms are those of the decoding path bit for bit, over steps
// of two micro-batches, with full recomputation too (blocks rerun in
// backward).
func TestBF16WeightsInPlace(t *testing.T) {
	cfg := model.Config{Layers: 2, Heads: 2, Embd: 64, Seq: 64, Vocab: 97}
	const B, T, micros, steps = 2, 64, 2, 3
	flat := make([]float32, cfg.NumParams())
	model.InitParams(cfg, 5, flat)
	rng := rand.New(rand.NewPCG(5, 6))
	x, y := make([]int32, micros*B*T), make([]int32, micros*B*T)
	for i := range x {
		x[i], y[i] = int32(rng.IntN(cfg.Vocab)), int32(rng.IntN(cfg.Vocab))
	}
	be := backend.CPU{Threads: 2, MatmulBF16: true}
	for stage := range 4 {
		for _, rc := range []model.Recompute{model.RecomputeNone, model.RecomputeFull} {
			t.Run(fmt.Sprintf("stage%d/%s", stage, rc), func(t *testing.T) {
				zc := Config{Stage: stage, Params: comm.BFloat16, Grads: comm.BFloat16, FirstBucket: 1 << 12, Bucket: 1 << 14, Threads: 2,
					Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}}
				lent, decoding := newBF16Engine(t, zc, cfg, flat), newBF16Engine(t, zc, cfg, flat)
				cs := &countingStore{Engine: lent, decoded: map[int]int{}}
				ml := newTestModel(t, cfg, B, T, be, rc, cs)
				md := newTestModel(t, cfg, B, T, be, rc, decodingStore{decoding})
				for s := range steps {
					ll, nl := trainStep(t, lent, ml, x, y, micros)
					ld, nd := trainStep(t, decoding, md, x, y, micros)
					if math.Float32bits(ll) != math.Float32bits(ld) || math.Float64bits(nl) != math.Float64bits(nd) {
						t.Fatalf("step %d: loss %v, norm %v with the weights in place; %v, %v decoded", s, ll, nl, ld, nd)
					}
				}
				final := cfg.Layers + 1
				if len(cs.decoded) != 1 || cs.decoded[final] != 2*micros*steps {
					t.Errorf("units decoded (unit: times): %v, want only the final LayerNorm's (%d), %d times", cs.decoded, final, 2*micros*steps)
				}
			})
		}
	}
}

func newBF16Engine(t *testing.T, zc Config, cfg model.Config, flat []float32) *Engine {
	t.Helper()
	e, err := New(zc, cfg, nil, flat)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func newTestModel(t *testing.T, cfg model.Config, B, T int, be backend.Backend, rc model.Recompute, st model.Store) *model.Model {
	t.Helper()
	m, err := model.NewWithStore(cfg, B, T, be, rc, st)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// trainStep runs one step of micros micro-batches of x, y (B·T tokens
// each) and returns the mean loss and the gradient norm.
func trainStep(t *testing.T, e *Engine, m *model.Model, x, y []int32, micros int) (float32, float64) {
	t.Helper()
	n := len(x) / micros
	var sum float32
	for i := range micros {
		e.BeginMicro(i, micros)
		loss, err := m.Forward(x[i*n:(i+1)*n], y[i*n:(i+1)*n])
		if err != nil {
			t.Fatal(err)
		}
		sum += loss / float32(micros)
		m.Backward(1 / float32(micros))
	}
	res, err := e.Step(1e-3)
	if err != nil {
		t.Fatal(err)
	}
	return sum, res.Norm
}
