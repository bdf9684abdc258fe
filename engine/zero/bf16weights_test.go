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
// model (Weights) and those whose gradients the model adds to (Grads); it
// fills what GradsWrite lends with NaN, which would show in the norm
// wherever the model did not write.
type countingStore struct {
	*Engine
	decoded, added map[int]int
}

func (s *countingStore) Weights(u int) []float32 {
	s.decoded[u]++
	return s.Engine.Weights(u)
}

func (s *countingStore) Grads(u int) []float32 {
	s.added[u]++
	return s.Engine.Grads(u)
}

func (s *countingStore) GradsWrite(u int) []float32 {
	g := s.Engine.GradsWrite(u)
	for i := range g {
		g[i] = float32(math.NaN())
	}
	return g
}

// TestBF16WeightsInPlace: with bf16 working parameters and bf16 matmuls
// the model multiplies by the engine's bf16 matrices in place and decodes
// only the final LayerNorm's unit (its vectors are the only parameters
// not in a block or the embeddings), and it writes the gradients of every
// unit but that one into unwritten scratch (GradsWrite), at every stage;
// the losses and gradient norms are those of the decoding, accumulating
// path bit for bit, over steps of two micro-batches, with full
// recomputation too (blocks rerun in backward). With fp16 (fp32 matmuls)
// only the gradients are written so; with fp32 gradients (grad_dtype
// fp32) only the weights are lent.
func TestBF16WeightsInPlace(t *testing.T) {
	cfg := model.Config{Layers: 2, Heads: 2, Embd: 64, Seq: 64, Vocab: 97}
	flat := make([]float32, cfg.NumParams())
	model.InitParams(cfg, 5, flat)
	rng := rand.New(rand.NewPCG(5, 6))
	x, y := make([]int32, lentMicros*lentB*lentT), make([]int32, lentMicros*lentB*lentT)
	for i := range x {
		x[i], y[i] = int32(rng.IntN(cfg.Vocab)), int32(rng.IntN(cfg.Vocab))
	}
	for _, prec := range []comm.DType{comm.BFloat16, comm.Float16} {
		be := backend.CPU{Threads: 2, MatmulBF16: prec == comm.BFloat16}
		for stage := range 4 {
			for _, rc := range []model.Recompute{model.RecomputeNone, model.RecomputeFull} {
				for _, grads := range []comm.DType{prec, comm.Float32} {
					t.Run(fmt.Sprintf("%s/grads-%s/stage%d/%s", prec, grads, stage, rc), func(t *testing.T) {
						testLentToModel(t, cfg, flat, x, y, be, prec, grads, stage, rc)
					})
				}
			}
		}
	}
}

// The micro-batches (lentB × lentT tokens) and steps of TestBF16WeightsInPlace.
const lentB, lentT, lentMicros, lentSteps = 2, 64, 2, 3

func testLentToModel(t *testing.T, cfg model.Config, flat []float32, x, y []int32, be backend.CPU, prec, grads comm.DType, stage int, rc model.Recompute) {
	const B, T, micros, steps = lentB, lentT, lentMicros, lentSteps
	zc := Config{Stage: stage, Params: prec, Grads: grads, FirstBucket: 1 << 12, Bucket: 1 << 14, Threads: 2,
		Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}}
	lent, decoding := newBF16Engine(t, zc, cfg, flat), newBF16Engine(t, zc, cfg, flat)
	cs := &countingStore{Engine: lent, decoded: map[int]int{}, added: map[int]int{}}
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
	if prec == comm.BFloat16 && (len(cs.decoded) != 1 || cs.decoded[final] != 2*micros*steps) {
		t.Errorf("units decoded (unit: times): %v, want only the final LayerNorm's (%d), %d times", cs.decoded, final, 2*micros*steps)
	}
	if grads == comm.Float32 { // accumulated in place: nothing to lend
		return
	}
	if len(cs.added) != 1 || cs.added[final] != micros*steps {
		t.Errorf("units whose gradients were added to (unit: times): %v, want only the final LayerNorm's (%d), %d times", cs.added, final, micros*steps)
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
