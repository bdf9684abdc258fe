package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
	"github.com/gtrain/gtrain/planner"
)

var _ pipeline.Stage = (*Stage)(nil)

// parCfg is small enough to run every layout of up to 4 ranks in a
// second, with 4 heads (tp 1, 2 and 4 divide them), 5 layers (pp 2, 3 and
// 4 split them unevenly: 3+2, 2+2+1, 2+1+1+1) and a vocabulary of 37
// (uneven over tp 2 and 4). B·T = 8 divides by every tp, as sequence
// parallelism needs.
var parCfg = Config{Layers: 5, Heads: 4, Embd: 16, Seq: 8, Vocab: 37}

const (
	parB, parT = 2, 4
	parMicros  = 5 // more than the 4 stages: 1F1B reaches its steady state
)

// Tolerances of the comparison with the dense model. Both compute the
// same float32 function; they differ only in summation order (a
// row-parallel layer sums its K over ranks, then reduces; the
// vocab-parallel cross-entropy rescales partial sums of exponentials; the
// gradients of micro-batches and of the tied embedding's two uses add in
// other orders). Each GEMM or reduction rounds within γ_K ≈ K·2⁻²⁴ ≤ 4e-6
// (K ≤ 4C = 64) of the magnitudes it sums; about a dozen such stages are
// chained through well-conditioned maps (LayerNorm of unit-scale rows,
// softmax of scores below 1), so the difference is a few 1e-6 of a
// tensor's largest gradient (measured: under 2e-6). A part taken from the
// wrong place, a bias added twice, a gradient not reduced or reduced
// twice, or a wrong loss scale is off by the tensor's own scale.
const (
	parGradTol = 1e-4 // × the largest |element| of the dense gradient of the tensor
	parLossTol = 1e-5 // relative to the dense mean loss
)

// parBatch is micro-batch micro's tokens, the same for both models.
func parBatch(micro int) (x, y []int32, err error) {
	x, y = testBatch(parB, parT, parCfg.Vocab, uint64(100+micro))
	return x, y, nil
}

// parParams are GPT-2's initial parameters plus noise, so that biases and
// LayerNorm gains are not 0 and 1: a bias added on every TP rank, or
// LayerNorm parameters applied to the wrong rows, would not show on zeros
// and ones.
func parParams() []float32 {
	full := make([]float32, parCfg.NumParams())
	InitParams(parCfg, 3, full)
	rng := rand.New(rand.NewPCG(4, 5))
	for i := range full {
		full[i] += float32(rng.NormFloat64() * 0.1)
	}
	return full
}

// denseStep runs the micro-batches through the dense model, as the
// trainer accumulates them, and returns the mean loss and the gradients.
func denseStep(t *testing.T, full []float32) (float32, []float32) {
	t.Helper()
	m, err := New(parCfg, parB, parT, backend.CPU{Threads: 1}, RecomputeNone)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Params, full)
	var sum float64
	for k := range parMicros {
		x, y, _ := parBatch(k)
		loss, err := m.Forward(x, y)
		if err != nil {
			t.Fatal(err)
		}
		m.Backward(1 / float32(parMicros))
		sum += float64(loss)
	}
	return float32(sum / parMicros), m.Grads
}

// parRank is one in-process rank's state after its step.
type parRank struct {
	world *comm.Communicator
	gs    *parallel.Groups
	stage *Stage
	sched pipeline.Schedule
}

// runParallel runs one step (1F1B over parMicros micro-batches) on tp·pp
// in-process ranks and returns them, their groups open until the test
// ends (so that no rank closes a link a peer still reads).
func runParallel(t *testing.T, tp, pp int, sp bool, full []float32) []*parRank {
	t.Helper()
	return runParallelRecompute(t, tp, pp, sp, RecomputeNone, full)
}

// runParallelRecompute is runParallel with the stages recomputing as rc
// says.
func runParallelRecompute(t *testing.T, tp, pp int, sp bool, rc Recompute, full []float32) []*parRank {
	t.Helper()
	n := tp * pp
	trs := comm.NewInProc(n)
	ranks := make([]*parRank, n)
	for r := range ranks {
		ranks[r] = &parRank{}
	}
	t.Cleanup(func() {
		for r, k := range ranks {
			if k.gs != nil {
				k.gs.Close()
			}
			if k.world != nil {
				k.world.Close()
			}
			trs[r].Close()
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if errs[r] = parRankStep(ctx, ranks[r], trs[r], r, tp, pp, sp, rc, full); errs[r] != nil {
				cancel() // the others fail rather than wait for this rank
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, n, err)
		}
	}
	return ranks
}

// parRankStep is one rank's step: groups, stage, schedule, reductions.
func parRankStep(ctx context.Context, k *parRank, tr comm.Transport, r, tp, pp int, sp bool, rc Recompute, full []float32) error {
	var err error
	// The timeout is a backstop only: a failing rank cancels the others.
	if k.world, err = comm.New(ctx, r, tp*pp, tr, comm.Options{Name: "world", Timeout: 2 * time.Minute}); err != nil {
		return err
	}
	if k.gs, err = parallel.New(ctx, k.world, planner.Grid{TP: tp, PP: pp, DP: 1}); err != nil {
		return err
	}
	split, err := pipeline.Split(parCfg.Layers, pp, nil)
	if err != nil {
		return err
	}
	k.stage, err = NewStage(StageSpec{Config: parCfg, B: parB, T: parT, Split: split, Stage: k.gs.Coord.PP,
		TP: tensorpar.NewGroup(k.gs.TP, backend.CPU{Threads: 1}, sp), Batch: parBatch, Recompute: rc})
	if err != nil {
		return err
	}
	if err := k.stage.LoadFull(full); err != nil {
		return err
	}
	k.stage.ZeroGrad()
	k.stage.DLoss = 1 / float32(parMicros)
	if k.sched, err = pipeline.New(pipeline.OneFOneB, pp, parMicros, 1); err != nil {
		return err
	}
	if err := pipeline.Run(ctx, k.sched, k.stage, k.gs.PP); err != nil {
		return err
	}
	if err := k.stage.ReduceNorms(ctx); err != nil {
		return err
	}
	return k.stage.ReduceTied(ctx, k.gs.Embed)
}

// TestStageMatchesDense: for every layout of tp·pp ≤ 4 ranks (dp 1), with
// and without sequence parallelism, one 1F1B step over 5 micro-batches
// gives the dense model's mean loss, and every rank's gradient of every
// part it holds is the dense gradient's part; assembled from all ranks
// (GradsToFull) they cover the whole model. Each stage keeps the
// activations of as many micro-batches as the schedule has in flight.
func TestStageMatchesDense(t *testing.T) {
	full := parParams()
	wantLoss, wantGrads := denseStep(t, full)
	params := parCfg.Params()
	scale := make(map[string]float64, len(params))
	for _, p := range params {
		scale[p.Name] = maxAbs(wantGrads[p.Offset : p.Offset+p.Size()])
		if scale[p.Name] == 0 {
			t.Fatalf("the dense gradient of %s is zero: the comparison would prove nothing", p.Name)
		}
	}
	var layouts int
	for tp := 1; tp <= 4; tp *= 2 {
		for pp := 1; tp*pp <= 4; pp++ {
			for _, sp := range []bool{false, true} {
				if sp && tp == 1 {
					continue
				}
				layouts++
				t.Run(fmt.Sprintf("tp%d/pp%d/sp=%v", tp, pp, sp), func(t *testing.T) {
					ranks := runParallel(t, tp, pp, sp, full)
					checkLosses(t, ranks, pp, wantLoss)
					assembled := make([]float32, len(full))
					for i := range assembled {
						assembled[i] = float32(math.NaN())
					}
					for r, k := range ranks {
						checkParts(t, r, k.stage, wantGrads, scale)
						if got, want := k.stage.allocated, k.sched.InFlight(k.gs.Coord.PP); got != want {
							t.Errorf("rank %d (stage %d): %d micro-batches' activations, want the schedule's %d in flight", r, k.gs.Coord.PP, got, want)
						}
						if err := k.stage.GradsToFull(assembled); err != nil {
							t.Fatal(err)
						}
					}
					for _, p := range params {
						assertNear(t, p.Name+" (assembled)", assembled[p.Offset:p.Offset+p.Size()], wantGrads[p.Offset:p.Offset+p.Size()], parGradTol*scale[p.Name])
					}
				})
			}
		}
	}
	if layouts != 10 {
		t.Fatalf("%d layouts, want 10 (tp1 × pp1-4, tp2 × pp1-2 and tp4 × pp1, tp>1 with and without sp)", layouts)
	}
}

// checkLosses compares the last stage's mean loss, on every TP rank, with
// the dense one; the other stages record none.
func checkLosses(t *testing.T, ranks []*parRank, pp int, want float32) {
	t.Helper()
	var seen int
	for r, k := range ranks {
		losses := k.stage.Losses()
		if k.gs.Coord.PP != pp-1 {
			if len(losses) != 0 {
				t.Errorf("rank %d (stage %d): losses %v on a stage without the loss", r, k.gs.Coord.PP, losses)
			}
			continue
		}
		seen++
		if len(losses) != parMicros {
			t.Fatalf("rank %d: %d losses, want %d", r, len(losses), parMicros)
		}
		var sum float64
		for _, l := range losses {
			sum += float64(l)
		}
		if got := float32(sum / parMicros); math.Abs(float64(got-want)) > parLossTol*math.Abs(float64(want)) {
			t.Errorf("rank %d: mean loss %v, dense %v", r, got, want)
		}
	}
	if seen == 0 {
		t.Fatal("no rank holds the last stage")
	}
}

// checkParts compares every part rank r holds with its part of the dense
// gradient.
func checkParts(t *testing.T, r int, st *Stage, dense []float32, scale map[string]float64) {
	t.Helper()
	if len(st.Shards()) == 0 {
		t.Fatalf("rank %d holds no parameters", r)
	}
	for _, p := range st.Shards() {
		want, err := p.Part.Extract(dense[p.Full.Offset:p.Full.Offset+p.Full.Size()], p.Full.Shape)
		if err != nil {
			t.Fatal(err)
		}
		assertNear(t, fmt.Sprintf("rank %d: %s (%v)", r, p.Name, p.Part.Split), st.Grads[p.Offset:p.Offset+p.Size()], want, parGradTol*scale[p.Name])
	}
}

// assertNear fails unless |got[i] − want[i]| ≤ tol for every i (a NaN
// fails too).
func assertNear(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, want %d", name, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if !(d <= tol) {
			d = math.Inf(1)
		}
		if at < 0 || d > worst {
			worst, at = d, i
		}
	}
	if worst > tol {
		t.Errorf("%s: element %d is %v, dense %v (tolerance %.3g)", name, at, got[at], want[at], tol)
	}
}

func maxAbs(s []float32) float64 {
	var m float64
	for _, v := range s {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// TestNewStageRefuses: a spec that cannot run is an error naming what to
// change, before anything is allocated.
func TestNewStageRefuses(t *testing.T) {
	be := backend.CPU{Threads: 1}
	one := tensorpar.NewGroup(nil, be, false)
	ok := StageSpec{Config: parCfg, B: parB, T: parT, TP: one, Split: []int{3, 2}, Stage: 0, Batch: parBatch}
	if _, err := NewStage(ok); err != nil {
		t.Fatalf("a valid spec: %v", err)
	}
	for _, c := range []struct {
		name, want string
		edit       func(s *StageSpec)
	}{
		{"no TP group", "no tensor-parallel group", func(s *StageSpec) { s.TP = nil }},
		{"split short of the layers", "adds up to 4 layers", func(s *StageSpec) { s.Split = []int{2, 2} }},
		{"stage out of range", "stage 2: out of range for 2", func(s *StageSpec) { s.Stage = 2 }},
		{"no batch on the first stage", "no Batch", func(s *StageSpec) { s.Batch = nil }},
		{"no batch on the last stage", "no Batch", func(s *StageSpec) { s.Batch, s.Stage = nil, 1 }},
		{"T past seq", "micro-batch 2×9", func(s *StageSpec) { s.T = 9 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := ok
			c.edit(&s)
			if _, err := NewStage(s); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	// Group-size checks need a group of that size: tp 3 (heads 4) and a
	// sequence-parallel tp 2 over 3 tokens.
	for _, c := range []struct {
		tp   int
		sp   bool
		T    int
		want string
	}{{3, false, parT, "tp 3 does not divide the 4 attention heads"}, {2, true, 3, "do not divide by tp 2"}} {
		trs := comm.NewInProc(c.tp)
		cms, errs := make([]*comm.Communicator, c.tp), make([]error, c.tp)
		var wg sync.WaitGroup
		for r := range c.tp {
			wg.Go(func() {
				cms[r], errs[r] = comm.New(t.Context(), r, c.tp, trs[r], comm.Options{Name: "tp", Timeout: time.Minute})
			})
		}
		wg.Wait()
		for r, cm := range cms {
			if errs[r] != nil {
				t.Fatalf("tp %d: rank %d: %v", c.tp, r, errs[r])
			}
			defer trs[r].Close()
			defer cm.Close()
		}
		s := ok
		s.TP, s.T, s.B = tensorpar.NewGroup(cms[0], be, c.sp), c.T, 1
		if _, err := NewStage(s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("tp %d: error %v, want one containing %q", c.tp, err, c.want)
		}
	}
}
