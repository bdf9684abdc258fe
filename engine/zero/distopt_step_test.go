package zero

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/tensorpar"
	"github.com/gtrain/gtrain/planner"
)

// Tolerances of the comparison with the dense model. The gradients differ
// from the dense ones by summation order only, a few 1e-6 of a tensor's
// largest element (engine/model's TestStageMatchesDense), which after
// clipping is below 1e-7 absolute; the averaging over DP and the norm's
// partial sums add rounding of the same order.
//
//   - The norm is a float64 sum of float32 squares: its relative error is
//     that of the gradients, measured up to 1.1e-7. distNormTol is 100
//     times that, and the test checks that counting the replicated tensors
//     twice (tp 2) or the tied embedding twice moves the norm by more than
//     10 × distNormTol, so it cannot pass with either mistake.
//   - A parameter moves by lr·m̂/(√v̂+eps) per step, whose derivative in
//     the gradient is at most lr/eps = 10: a gradient off by 1e-7 moves
//     it by 1e-6 at worst, and each step rounds parameters of magnitude
//     up to 1 at 6e-8. Measured: at most 2.4e-7 after three steps.
const (
	distNormTol  = 1e-5 // relative to the dense norm
	distParamTol = 2e-6 // absolute, on every parameter
)

// distRef is the dense run a layout of dp replicas is compared with.
type distRef struct {
	clip   float64
	norms  []float64
	params [][]float32
}

// denseRef trains the dense model on dp replicas' global batch with the
// clip at half the smallest unclipped norm, so that every step clips, and
// checks that the norm would show a replicated or tied tensor counted
// twice.
func denseRef(t *testing.T, refs map[int]*distRef, full []float32, dp int) *distRef {
	t.Helper()
	if r := refs[dp]; r != nil {
		return r
	}
	free, _, _ := denseRun(t, full, dp, 0)
	r := &distRef{clip: 0.5 * slices.Min(free)}
	var grad0 []float32
	r.norms, r.params, grad0 = denseRun(t, full, dp, r.clip)
	for s, n := range r.norms {
		if !(n > r.clip) {
			t.Fatalf("dp %d step %d: dense norm %g within the clip %g: the test would not exercise clipping", dp, s, n, r.clip)
		}
	}
	var rep, tied float64
	for _, p := range distCfg.Params() {
		g := grad0[p.Offset : p.Offset+p.Size()]
		switch {
		case p.Name == tiedName:
			tied += squareSum(g)
		case tensorpar.SplitOf(p.Name) == tensorpar.Replicated:
			rep += squareSum(g)
		}
	}
	n2 := r.norms[0] * r.norms[0]
	for name, extra := range map[string]float64{"replicated tensors": rep, "tied embedding": tied} {
		if shift := math.Sqrt((n2+extra)/n2) - 1; !(shift > 10*distNormTol) {
			t.Fatalf("dp %d: the %s counted twice move the norm by %.3g only: the norm check could not see it", dp, name, shift)
		}
	}
	refs[dp] = r
	return r
}

func squareSum(g []float32) float64 {
	var s float64
	for _, v := range g {
		s += float64(v) * float64(v)
	}
	return s
}

// TestDistMatchesDense: on every layout of up to 8 ranks the test model
// allows (39 with and without sequence parallelism), at ZeRO 0 and 1,
// three clipped AdamW steps of the distributed optimizer after 1F1B give
// the dense model's global norm on every rank and its parameters, trained
// on the same global batch; every copy of a parameter (DP replicas, TP
// replicated tensors, the tied embedding) stays the same bit for bit;
// ZeRO-1 keeps 1/dp of the optimizer state and gives ZeRO-0's parameters.
func TestDistMatchesDense(t *testing.T) {
	full := distParams()
	refs := map[int]*distRef{}
	layouts := distLayouts()
	if len(layouts) != 39 {
		t.Fatalf("%d layouts, want 39 (tp·pp·dp ≤ 8, tp 1/2/4, pp ≤ 5, sp on and off for tp > 1)", len(layouts))
	}
	for _, l := range layouts {
		t.Run(l.String(), func(t *testing.T) {
			d := denseRef(t, refs, full, l.grid.DP)
			var got [2][][]float32
			for stage := range 2 {
				ranks := runDist(t, l, stage, full, d.clip, nil)
				checkOwned(t, l, stage, ranks)
				for s := range distSteps {
					name := fmt.Sprintf("%v zero%d step %d", l, stage, s)
					checkNorms(t, name, ranks, s, d.norms[s])
					p := assemble(t, l, ranks, s)
					assertClose(t, name+": parameters vs dense", p, d.params[s], distParamTol)
					got[stage] = append(got[stage], p)
				}
			}
			for s := range distSteps {
				assertClose(t, fmt.Sprintf("%v step %d: zero1 vs zero0", l, s), got[1][s], got[0][s], distParamTol)
			}
		})
	}
}

// checkNorms: every rank computed the same norm, bit for bit, and it is
// the dense one.
func checkNorms(t *testing.T, name string, ranks []*distRank, s int, want float64) {
	t.Helper()
	for r, k := range ranks {
		if got := k.norms[s]; math.Float64bits(got) != math.Float64bits(ranks[0].norms[s]) {
			t.Fatalf("%s: rank %d's norm %v differs from rank 0's %v", name, r, got, ranks[0].norms[s])
		}
	}
	if got := ranks[0].norms[s]; !(math.Abs(got-want) <= distNormTol*want) {
		t.Fatalf("%s: global norm %.9g, dense %.9g (relative tolerance %g)", name, got, want, distNormTol)
	}
}

// checkOwned: at ZeRO-0 every rank keeps the optimizer state of its whole
// shard; at ZeRO-1 the DP group's ranks split it by comm.Block.
func checkOwned(t *testing.T, l distLayout, stage int, ranks []*distRank) {
	t.Helper()
	for r, k := range ranks {
		n, want := len(k.params[0]), len(k.params[0])
		if stage == 1 {
			lo, hi := comm.Block(n, k.coord.DP, l.grid.DP)
			want = hi - lo
		}
		if k.owned != want || k.adam != distSteps {
			t.Fatalf("%v zero%d: rank %d keeps the state of %d of its %d elements (want %d) after %d AdamW steps (want %d)",
				l, stage, r, k.owned, n, want, k.adam, distSteps)
		}
	}
}

// assertClose fails unless |got[i] − want[i]| ≤ tol for every i (a NaN
// fails too).
func assertClose(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, want %d", name, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol) {
			t.Fatalf("%s: element %d is %v, want %v (tolerance %g)", name, i, got[i], want[i], tol)
		}
	}
}

// TestDistNonFiniteSkips: a NaN in one rank's gradient of a tensor that
// rank does not count in the norm (replicated, on TP rank 1) makes every
// rank of tp2·pp2·dp2 skip that step at ZeRO 0 and 1: the norm is NaN
// everywhere, no parameter moves and AdamW does not count the step; the
// next step updates again.
func TestDistNonFiniteSkips(t *testing.T) {
	l := distLayout{grid: planner.Grid{TP: 2, PP: 2, DP: 2}, sp: true}
	const badStep = 1
	poison := func(r, s int, st *model.Stage) {
		if s != badStep || r != l.grid.World()-1 { // dp 1, pp 1, tp 1
			return
		}
		shards := st.Shards()
		last := shards[len(shards)-1] // ln_f.bias: replicated
		if last.Part.Split != tensorpar.Replicated {
			panic(fmt.Sprintf("%s is not replicated", last.Name))
		}
		st.Grads[last.Offset] = float32(math.NaN())
	}
	for stage := range 2 {
		ranks := runDist(t, l, stage, distParams(), 0.1, poison)
		for r, k := range ranks {
			if !k.bad[badStep] || !math.IsNaN(k.norms[badStep]) || k.bad[0] || k.bad[2] {
				t.Fatalf("zero%d rank %d: non-finite by step %v, norms %v: want step %d alone, with a NaN norm", stage, r, k.bad, k.norms, badStep)
			}
			if !slices.Equal(k.params[badStep], k.params[badStep-1]) {
				t.Errorf("zero%d rank %d: the skipped step changed parameters", stage, r)
			}
			if slices.Equal(k.params[badStep+1], k.params[badStep]) || k.adam != distSteps-1 {
				t.Errorf("zero%d rank %d: after the skipped step, %d AdamW steps in all (want %d), or the next step did not update", stage, r, k.adam, distSteps-1)
			}
		}
	}
}

// TestNewDistRefuses: a stage or layout the optimizer cannot step is an
// error naming what to change.
func TestNewDistRefuses(t *testing.T) {
	tr := comm.NewInProc(1)[0]
	defer tr.Close()
	world, err := comm.New(t.Context(), 0, 1, tr, comm.Options{Name: "world"})
	if err != nil {
		t.Fatal(err)
	}
	defer world.Close()
	gs, err := parallel.New(t.Context(), world, planner.Grid{TP: 1, PP: 1, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	two := []ShardTensor{
		{Param: model.Param{Name: "a", Shape: []int{3}, Offset: 0}},
		{Param: model.Param{Name: "b", Shape: []int{2}, Offset: 3}},
	}
	ok := func() (DistConfig, *parallel.Groups, []ShardTensor, []float32, []float32) {
		return DistConfig{Stage: 1, Optim: distOptim}, gs, slices.Clone(two), make([]float32, 5), make([]float32, 5)
	}
	if _, err := NewDist(ok()); err != nil {
		t.Fatalf("a valid setup: %v", err)
	}
	for _, c := range []struct {
		name, want string
		edit       func(cfg *DistConfig, gs **parallel.Groups, ts *[]ShardTensor, p, g *[]float32)
	}{
		{"zero 2", "set zero.stage to 0 or 1", func(cfg *DistConfig, _ **parallel.Groups, _ *[]ShardTensor, _, _ *[]float32) { cfg.Stage = 2 }},
		{"zero 3", "only stages 0 and 1", func(cfg *DistConfig, _ **parallel.Groups, _ *[]ShardTensor, _, _ *[]float32) { cfg.Stage = 3 }},
		{"bad optimizer", "lr 0", func(cfg *DistConfig, _ **parallel.Groups, _ *[]ShardTensor, _, _ *[]float32) { cfg.Optim.LR = 0 }},
		{"no groups", "no process groups", func(_ *DistConfig, gs **parallel.Groups, _ *[]ShardTensor, _, _ *[]float32) { *gs = nil }},
		{"grads short", "5 parameters but 4 gradients", func(_ *DistConfig, _ **parallel.Groups, _ *[]ShardTensor, _, g *[]float32) { *g = (*g)[:4] }},
		{"gap", "at offset 4", func(_ *DistConfig, _ **parallel.Groups, ts *[]ShardTensor, _, _ *[]float32) { (*ts)[1].Offset = 4 }},
		{"short of the params", "cover 3 elements of 5", func(_ *DistConfig, _ **parallel.Groups, ts *[]ShardTensor, _, _ *[]float32) { *ts = (*ts)[:1] }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, gs, ts, p, g := ok()
			c.edit(&cfg, &gs, &ts, &p, &g)
			if _, err := NewDist(cfg, gs, ts, p, g); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
