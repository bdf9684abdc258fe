package model

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
	"github.com/gtrain/gtrain/planner"
)

// chunkLayout is an interleaved layout of parCfg: tp × pp ranks with v
// chunks each over micros micro-batches, the layers split over the pp·v
// virtual stages as split says (nil: the planner's split).
type chunkLayout struct {
	tp, pp, v, micros int
	sp                bool
	split             []int
}

// TestStageChunksMatchDense: on interleaved layouts (pp 2 with 2 chunks,
// alone, with tp 2 and sequence parallelism, with an explicit split and
// with m = p, where the schedule runs every forward first), one step of
// the interleaved schedule gives the dense model's mean loss over the same
// micro-batches, every rank's gradient of every part it holds is the
// dense gradient's part and, assembled from all ranks, they cover the
// whole model; each chunk keeps the activation sets the schedule has in
// flight through it, and the stage reports exactly what
// StageActivationUseOf counts for that and, on the planner's split, what
// planner.RankMemory charges the rank (checkChunkPlanned).
func TestStageChunksMatchDense(t *testing.T) {
	full := parParams()
	for _, l := range []chunkLayout{
		{tp: 1, pp: 2, v: 2, micros: 4},
		{tp: 2, pp: 2, v: 2, micros: 4, sp: true},
		{tp: 1, pp: 2, v: 2, micros: 6, split: []int{2, 1, 1, 1}},
		{tp: 1, pp: 2, v: 2, micros: 2},
	} {
		t.Run(fmt.Sprintf("tp%d/pp%d/v%d/m%d/split%v", l.tp, l.pp, l.v, l.micros, l.split), func(t *testing.T) {
			wantLoss, wantGrads := denseSteps(t, full, l.micros)
			ranks := runChunked(t, l, full)
			assembled := make([]float32, len(full))
			for i := range assembled {
				assembled[i] = float32(math.NaN())
			}
			var losses int
			for r, k := range ranks {
				if k.stage.Chunks() != l.v {
					t.Fatalf("rank %d: %d chunks, want %d", r, k.stage.Chunks(), l.v)
				}
				losses += checkChunkLoss(t, r, k, l, wantLoss)
				checkParts(t, r, k.stage, wantGrads, gradScales(t, wantGrads))
				checkChunkSets(t, r, k, l)
				if err := k.stage.GradsToFull(assembled); err != nil {
					t.Fatal(err)
				}
			}
			if losses != l.tp {
				t.Fatalf("%d ranks report losses, want the last stage's %d", losses, l.tp)
			}
			for _, p := range parCfg.Params() {
				assertNear(t, p.Name+" (assembled)", assembled[p.Offset:p.Offset+p.Size()], wantGrads[p.Offset:p.Offset+p.Size()],
					parGradTol*maxAbs(wantGrads[p.Offset:p.Offset+p.Size()]))
			}
		})
	}
}

// denseSteps is denseStep over micros micro-batches.
func denseSteps(t *testing.T, full []float32, micros int) (float32, []float32) {
	t.Helper()
	m, err := New(parCfg, parB, parT, backend.CPU{Threads: 1}, RecomputeNone)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Params, full)
	var sum float64
	for k := range micros {
		x, y, _ := parBatch(k)
		loss, err := m.Forward(x, y)
		if err != nil {
			t.Fatal(err)
		}
		m.Backward(1 / float32(micros))
		sum += float64(loss)
	}
	return float32(sum / float64(micros)), m.Grads
}

// gradScales is each tensor's largest dense gradient, none of them 0.
func gradScales(t *testing.T, dense []float32) map[string]float64 {
	t.Helper()
	scale := map[string]float64{}
	for _, p := range parCfg.Params() {
		if scale[p.Name] = maxAbs(dense[p.Offset : p.Offset+p.Size()]); scale[p.Name] == 0 {
			t.Fatalf("the dense gradient of %s is zero: the comparison would prove nothing", p.Name)
		}
	}
	return scale
}

// checkChunkLoss compares rank r's mean loss with the dense one on the
// last stage, and finds none elsewhere; it returns 1 where there is one.
func checkChunkLoss(t *testing.T, r int, k *parRank, l chunkLayout, want float32) int {
	t.Helper()
	losses := k.stage.Losses()
	if k.gs.Coord.PP != l.pp-1 {
		if len(losses) != 0 {
			t.Errorf("rank %d (stage %d): losses %v on a stage without the loss", r, k.gs.Coord.PP, losses)
		}
		return 0
	}
	if len(losses) != l.micros {
		t.Fatalf("rank %d: %d losses, want %d", r, len(losses), l.micros)
	}
	var sum float64
	for _, v := range losses {
		sum += float64(v)
	}
	if got := float32(sum / float64(l.micros)); math.Abs(float64(got-want)) > parLossTol*math.Abs(float64(want)) {
		t.Errorf("rank %d: mean loss %v, dense %v", r, got, want)
	}
	return 1
}

// checkChunkSets holds each chunk's activation sets to the schedule's
// count and the stage's ActivationUse to StageActivationUseOf's.
func checkChunkSets(t *testing.T, r int, k *parRank, l chunkLayout) {
	t.Helper()
	want := k.sched.ChunkInFlight(k.gs.Coord.PP)
	for c, ch := range k.stage.chunks() {
		if ch.allocated != want[c] {
			t.Errorf("rank %d chunk %d: %d activation sets, want the schedule's %d in flight", r, c, ch.allocated, want[c])
		}
	}
	split, err := pipeline.Split(parCfg.Layers, l.pp*l.v, l.split)
	if err != nil {
		t.Fatal(err)
	}
	sh := StageShape{Config: parCfg, B: parB, T: parT, TP: l.tp, TPRank: k.gs.Coord.TP, SequenceParallel: l.sp,
		Split: split, Stage: k.gs.Coord.PP, Chunks: l.v, ChunkInFlight: want}
	u := k.stage.ActivationUse()
	if dry, err := StageActivationUseOf(sh, k.stage.be.AttentionScratch(parT)); err != nil || dry != u {
		t.Errorf("rank %d: StageActivationUseOf %+v, %v; the stage holds %+v", r, dry, err, u)
	}
	if l.split == nil {
		checkChunkPlanned(t, r, k, l)
	}
}

// checkChunkPlanned holds rank r's activations to what the planner
// charges it with l's virtual stages, but for the rounding of the
// vocabulary over tp that checkStagePlanned allows for.
func checkChunkPlanned(t *testing.T, r int, k *parRank, l chunkLayout) {
	t.Helper()
	pr := stageProblem(l.sp)
	pr.GlobalBatch = parB * l.micros
	pl := planner.Layout{Grid: planner.Grid{TP: l.tp, PP: l.pp, DP: 1}, MicroBatch: parB, Recompute: planner.RecomputeNone, VirtualStages: l.v}
	c := k.gs.Coord
	mem, err := planner.RankMemory(pr, pl, planner.Coord{PP: c.PP, TP: c.TP})
	if err != nil {
		t.Fatal(err)
	}
	want := mem.Activations
	if last := k.stage.last(); last.dims.isLast {
		lo, hi := comm.Block(parCfg.Vocab, c.TP, l.tp)
		want += 4 * float64(parB*parT) * (float64(hi-lo) - float64(parCfg.Vocab)/float64(l.tp)) * float64(last.allocated)
	}
	u := k.stage.ActivationUse()
	if got := float64(u.Layers + u.Head + u.Working); got != want {
		t.Errorf("rank %d (stage %d, tp rank %d): %+v: %g bytes the planner counts, want %g", r, c.PP, c.TP, u, got, want)
	}
}

// runChunked runs one interleaved step on l's ranks, as runParallel does.
func runChunked(t *testing.T, l chunkLayout, full []float32) []*parRank {
	t.Helper()
	n := l.tp * l.pp
	trs := comm.NewInProc(n)
	commtest.CloseAtEnd(t, trs) // after the groups over them
	ranks := make([]*parRank, n)
	for r := range ranks {
		ranks[r] = &parRank{}
	}
	t.Cleanup(func() {
		for _, k := range ranks {
			if k.gs != nil {
				k.gs.Close()
			}
			if k.world != nil {
				k.world.Close()
			}
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// A failing rank cancels the others rather than have them wait for it.
	commtest.Must(t, n, cancel, func(r int) error { return chunkedStep(ctx, ranks[r], trs[r], r, l, full) })
	return ranks
}

// chunkedStep is parRankStep for an interleaved layout.
func chunkedStep(ctx context.Context, k *parRank, tr comm.Transport, r int, l chunkLayout, full []float32) error {
	var err error
	// The timeout is a backstop only: a failing rank cancels the others.
	if k.world, err = comm.New(ctx, r, l.tp*l.pp, tr, comm.Options{Name: "world", Timeout: 2 * time.Minute}); err != nil {
		return err
	}
	if k.gs, err = parallel.New(ctx, k.world, planner.Grid{TP: l.tp, PP: l.pp, DP: 1}); err != nil {
		return err
	}
	split, err := pipeline.Split(parCfg.Layers, l.pp*l.v, l.split)
	if err != nil {
		return err
	}
	k.stage, err = NewStage(StageSpec{Config: parCfg, B: parB, T: parT, Split: split, Stage: k.gs.Coord.PP, Chunks: l.v,
		TP: tensorpar.NewGroup(k.gs.TP, backend.CPU{Threads: 1}, l.sp), Batch: parBatch})
	if err != nil {
		return err
	}
	if err := k.stage.LoadFull(full); err != nil {
		return err
	}
	k.stage.ZeroGrad()
	k.stage.DLoss = 1 / float32(l.micros)
	if k.sched, err = pipeline.New(pipeline.Interleaved, l.pp, l.micros, l.v); err != nil {
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

// TestStageChunksRefuse: an interleaved spec that cannot run, and a pass
// on a chunk the rank does not hold, are errors saying why.
func TestStageChunksRefuse(t *testing.T) {
	one := tensorpar.NewGroup(nil, backend.CPU{Threads: 1}, false)
	ok := StageSpec{Config: parCfg, B: parB, T: parT, TP: one, Split: []int{1, 1, 1, 2}, Stage: 1, Chunks: 2, Batch: parBatch}
	st, err := NewStage(ok)
	if err != nil {
		t.Fatalf("a valid spec: %v", err)
	}
	if first, end := st.ChunkLayers(1); first != 3 || end != 5 {
		t.Errorf("rank 1's chunk 1 holds layers [%d, %d), want virtual stage 3's [3, 5)", first, end)
	}
	for _, c := range []struct {
		name, want string
		edit       func(s *StageSpec)
	}{
		{"chunks not dividing the split", "3 virtual stages do not divide into 2 chunks", func(s *StageSpec) { s.Split = []int{2, 2, 1} }},
		{"one stage", "2 model chunks on 1 pipeline stage", func(s *StageSpec) { s.Split = []int{3, 2} }},
		{"stage past pp", "stage 2: out of range for 2", func(s *StageSpec) { s.Stage = 2 }},
		{"too many chunks", "model chunks per rank", func(s *StageSpec) { s.Chunks = pipeline.MaxChunks + 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := ok
			c.edit(&s)
			if _, err := NewStage(s); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	n := st.InputLen(2)
	if err := st.Forward(t.Context(), 2, 0, make([]float32, n), make([]float32, n)); err == nil || !strings.Contains(err.Error(), "model chunk 2: the rank holds 2") {
		t.Errorf("forward of chunk 2: %v, want a refusal", err)
	}
}
