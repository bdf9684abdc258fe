package zero

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
	"github.com/gtrain/gtrain/planner"
)

// distCfg is engine/model's TestStageMatchesDense model: 4 heads (tp 1, 2
// and 4 divide them), 5 layers (pp 2 to 5, split unevenly up to 4), a
// vocabulary of 37 (uneven over tp 2 and 4), B·T = 8 rows (divisible by
// every tp, as sequence parallelism needs).
var distCfg = model.Config{Layers: 5, Heads: 4, Embd: 16, Seq: 8, Vocab: 37}

const (
	distB, distT = 2, 4
	distMicros   = 3 // per DP replica and step
	distSteps    = 3
	distLR       = 1e-2
)

// distOptim clips (GradClip is set below the first step's norm by
// distClip) and has an eps near the size of a clipped gradient element, so
// that the clip factor shows in the update: AdamW is otherwise invariant
// to the gradient's scale, and a norm counted wrong would change nothing.
var distOptim = optim.Config{LR: distLR, Beta1: 0.9, Beta2: 0.95, Eps: 1e-3, WeightDecay: 0.1}

// distBatch is global micro-batch k of step s: replica d of dp reads
// micro-batches d·distMicros … (d+1)·distMicros−1, the dense model all.
func distBatch(s, k int) (x, y []int32) {
	rng := rand.New(rand.NewPCG(uint64(1000*s+k), 7))
	toks := make([]int32, distB*distT+1)
	for i := range toks {
		toks[i] = int32(rng.IntN(distCfg.Vocab))
	}
	return toks[:distB*distT], toks[1:]
}

// distParams are GPT-2's initial parameters plus noise, so that biases and
// LayerNorm gains are not 0 and 1.
func distParams() []float32 {
	full := make([]float32, distCfg.NumParams())
	model.InitParams(distCfg, 3, full)
	rng := rand.New(rand.NewPCG(4, 5))
	for i := range full {
		full[i] += float32(rng.NormFloat64() * 0.1)
	}
	return full
}

// denseRun trains the dense model distSteps steps on the global batch of
// dp replicas, clipping at clip (AdamW over the whole vector, the clip
// folded in as the engine does), and returns each step's norm, the
// parameters after it, and the first step's gradient.
func denseRun(t *testing.T, full []float32, dp int, clip float64) (norms []float64, params [][]float32, grad0 []float32) {
	t.Helper()
	m, err := model.New(distCfg, distB, distT, backend.CPU{Threads: 1}, model.RecomputeNone)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Params, full)
	cfg := distOptim
	cfg.GradClip = clip
	opt := optim.NewAdamW(cfg, len(full), nil)
	var parts []optim.Part
	for _, p := range distCfg.Params() {
		parts = append(parts, optim.Part{P: m.Params[p.Offset : p.Offset+p.Size()], G: m.Grads[p.Offset : p.Offset+p.Size()], At: p.Offset, Decay: p.Decay})
	}
	micros := dp * distMicros
	for s := range distSteps {
		clear(m.Grads)
		for k := range micros {
			x, y := distBatch(s, k)
			if _, err := m.Forward(x, y); err != nil {
				t.Fatal(err)
			}
			m.Backward(1 / float32(micros))
		}
		norm := optim.GradNorm(m.Grads)
		if s == 0 {
			grad0 = slices.Clone(m.Grads)
		}
		opt.UpdateParts(parts, distLR, float32(optim.ClipScale(norm, clip)))
		norms, params = append(norms, norm), append(params, slices.Clone(m.Params))
	}
	return norms, params, grad0
}

// distRank is what one in-process rank did.
type distRank struct {
	coord  planner.Coord
	shards []model.ShardParam
	params [][]float32 // the shard after each step
	norms  []float64   // each step's global norm
	bad    []bool      // each step's NonFinite
	owned  int         // elements of optimizer state
	adam   int         // AdamW steps taken at the end
}

// distLayout is one run's layout: a grid and sequence parallelism.
type distLayout struct {
	grid planner.Grid
	sp   bool
}

func (l distLayout) String() string {
	return fmt.Sprintf("tp%d/pp%d/dp%d/sp=%v", l.grid.TP, l.grid.PP, l.grid.DP, l.sp)
}

// runDist trains distSteps steps on every rank of l in process: 1F1B over
// distMicros micro-batches, ReduceNorms, ReduceTied, then the distributed
// optimizer's step. before, if not nil, runs on each rank just before
// each Step.
func runDist(t *testing.T, l distLayout, stage int, full []float32, clip float64, before func(r, s int, st *model.Stage)) []*distRank {
	t.Helper()
	n := l.grid.World()
	trs := comm.NewInProc(n)
	ranks := make([]*distRank, n)
	errs := make([]error, n)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		ranks[r] = &distRank{}
		wg.Go(func() {
			if errs[r] = distRankRun(ctx, ranks[r], trs[r], r, l, stage, full, clip, before); errs[r] != nil {
				cancel() // the others fail rather than wait for this rank
			}
		})
	}
	wg.Wait()
	for r := range n {
		trs[r].Close()
	}
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%v zero%d: rank %d: %v", l, stage, r, err)
		}
	}
	return ranks
}

// distRankRun is one rank's run: groups, stage, optimizer, steps.
func distRankRun(ctx context.Context, k *distRank, tr comm.Transport, r int, l distLayout, stage int, full []float32, clip float64, before func(r, s int, st *model.Stage)) error {
	// The timeout is a backstop only: a failing rank cancels the others.
	world, err := comm.New(ctx, r, l.grid.World(), tr, comm.Options{Name: "world", Timeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	defer world.Close()
	gs, err := parallel.New(ctx, world, l.grid)
	if err != nil {
		return err
	}
	defer gs.Close()
	k.coord = gs.Coord
	split, err := pipeline.Split(distCfg.Layers, l.grid.PP, nil)
	if err != nil {
		return err
	}
	step := 0
	batch := func(micro int) (x, y []int32, err error) {
		x, y = distBatch(step, gs.Coord.DP*distMicros+micro)
		return x, y, nil
	}
	st, err := model.NewStage(model.StageSpec{Config: distCfg, B: distB, T: distT, Split: split, Stage: gs.Coord.PP,
		TP: tensorpar.NewGroup(gs.TP, backend.CPU{Threads: 1}, l.sp), Batch: batch})
	if err != nil {
		return err
	}
	if err := st.LoadFull(full); err != nil {
		return err
	}
	k.shards = st.Shards()
	cfg := DistConfig{Stage: stage, Optim: distOptim}
	cfg.Optim.GradClip = clip
	opt, err := NewDist(cfg, gs, StageTensors(st), st.Params, st.Grads)
	if err != nil {
		return err
	}
	k.owned = len(opt.Optimizer().M)
	sched, err := pipeline.New(pipeline.OneFOneB, l.grid.PP, distMicros, 1)
	if err != nil {
		return err
	}
	for step = range distSteps {
		st.ZeroGrad()
		st.DLoss = 1 / float32(distMicros)
		if err := pipeline.Run(ctx, sched, st, gs.PP); err != nil {
			return err
		}
		if err := st.ReduceNorms(ctx); err != nil {
			return err
		}
		if err := st.ReduceTied(ctx, gs.Embed); err != nil {
			return err
		}
		if before != nil {
			before(r, step, st)
		}
		res, err := opt.Step(ctx, distLR)
		if err != nil {
			return err
		}
		k.norms, k.params = append(k.norms, res.Norm), append(k.params, slices.Clone(st.Params))
		k.bad = append(k.bad, res.NonFinite)
	}
	k.adam = opt.Optimizer().Step
	return nil
}

// distLayouts is every layout of tp·pp·dp ≤ 8 ranks distCfg allows: tp 1,
// 2, 4 (the heads), pp up to 5 (the layers), sequence parallelism on and
// off where tp > 1.
func distLayouts() []distLayout {
	var ls []distLayout
	for tp := 1; tp <= 4; tp *= 2 {
		for pp := 1; pp <= distCfg.Layers && tp*pp <= 8; pp++ {
			for dp := 1; tp*pp*dp <= 8; dp++ {
				for _, sp := range []bool{false, true} {
					if !sp || tp > 1 {
						ls = append(ls, distLayout{grid: planner.Grid{TP: tp, PP: pp, DP: dp}, sp: sp})
					}
				}
			}
		}
	}
	return ls
}

// assemble writes the shards every rank holds after step s into the full
// layout and fails unless they cover it and every copy of an element (DP
// replicas, a tensor replicated over TP, the tied embedding's two stages)
// is the same bit for bit: otherwise the replicas would drift apart.
func assemble(t *testing.T, l distLayout, ranks []*distRank, s int) []float32 {
	t.Helper()
	full := make([]float32, distCfg.NumParams())
	set := make([]bool, len(full))
	for r, k := range ranks {
		for _, p := range k.shards {
			for j, at := range partIndices(t, p) {
				v := k.params[s][p.Offset+j]
				if set[at] && math.Float32bits(full[at]) != math.Float32bits(v) {
					t.Fatalf("%v step %d: rank %d (dp=%d pp=%d tp=%d) has %s = %v at flat %d, another copy %v",
						l, s, r, k.coord.DP, k.coord.PP, k.coord.TP, p.Name, v, at, full[at])
				}
				full[at], set[at] = v, true
			}
		}
	}
	if i := slices.Index(set, false); i >= 0 {
		t.Fatalf("%v step %d: element %d of the model is on no rank", l, s, i)
	}
	return full
}

// partIndices is, for each element of p's part, its index in the full
// flat layout: Extract applied to the indices themselves (exact in
// float32 below 2²⁴).
func partIndices(t *testing.T, p model.ShardParam) []int {
	t.Helper()
	idx := make([]float32, p.Full.Size())
	for i := range idx {
		idx[i] = float32(p.Full.Offset + i)
	}
	part, err := p.Part.Extract(idx, p.Full.Shape)
	if err != nil {
		t.Fatal(err)
	}
	pos := make([]int, len(part))
	for j, v := range part {
		pos[j] = int(v)
	}
	return pos
}
