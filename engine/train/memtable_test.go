package train

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/planner"
)

// memTableLayouts are the layouts of docs/planner.md's table "Engine
// memory vs the planner", at ZeRO 0, and at ZeRO 1 where it partitions
// something: over 2 replicas (on one it is ZeRO 0), so tp2·pp2 at ZeRO 1
// runs on 8 ranks.
var memTableLayouts = []gridLayout{
	{tp: 1, pp: 1, dp: 1}, {tp: 1, pp: 1, dp: 2}, {tp: 1, pp: 1, dp: 2, zero: 1}, {tp: 2, pp: 1, dp: 1}, {tp: 1, pp: 2, dp: 1},
	{tp: 2, pp: 2, dp: 1}, {tp: 2, pp: 2, dp: 2, zero: 1},
}

// memTableSpec is one step of the small preset (6 layers of 384, 6 heads,
// a vocabulary of 257) on a global batch of 4 sequences of 128 tokens:
// micro-batches of 2, so 2 of them per step on one replica (1F1B then has
// two in flight on the first of 2 stages) and 1 on each of 2 replicas.
func memTableSpec(l gridLayout) Spec {
	s := smallSpec("")
	s.Model = ModelSpec{Preset: "small"}
	s.Checkpoint, s.Eval = CkptSpec{}, EvalSpec{}
	s.Steps, s.Threads = 1, 1
	s.Data.Synthetic = 4_000
	s.Batch = BatchSpec{MicroBatch: 2, Seq: 128, GradAccum: 2 / l.dp}
	s.Parallel.TP, s.Parallel.PP, s.Parallel.ZeroStage = l.tp, l.pp, l.zero
	return s
}

// TestEngineMemoryVsPlanner trains one step of each layout of the table
// and compares every rank's memory, as its status record reports it, with
// the planner's figure for that rank (planner.RankMemory of the job as
// run --auto describes it): the activations differ by exactly what the
// planner leaves to its usable-memory margin (model.ActivationUse.Other:
// LayerNorm statistics, token ids and losses, backward's scratch) and,
// on the last stage of tp 2, by the rounding of the planner's V/t logit
// rows to the rank's comm.Block (129 or 128 of 257). With -v it prints
// the table of docs/planner.md (go test ./engine/train -run
// TestEngineMemoryVsPlanner -v).
func TestEngineMemoryVsPlanner(t *testing.T) {
	var table strings.Builder
	table.WriteString("| layout | ZeRO | rank (dp, pp, tp) | params | grads | optimizer | activations | buffers | total |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range memTableLayouts {
		spec := memTableSpec(l)
		n := l.tp * l.pp * l.dp
		_, recs := runWithStatus(t, spec, n)
		rs, err := spec.Resolved()
		if err != nil {
			t.Fatal(err)
		}
		if rs, err = fitDP(rs, Env{World: n}); err != nil {
			t.Fatal(err)
		}
		pr, err := enginePlan(rs, planner.CPUTopology([]int{n}, 1<<40, n))
		if err != nil {
			t.Fatal(err)
		}
		layout := planner.Layout{Grid: planner.Grid{TP: l.tp, PP: l.pp, DP: l.dp}, ZeroStage: l.zero, MicroBatch: 2, Recompute: planner.RecomputeNone}
		for r, rec := range recs {
			c := layout.Grid.Coord(r)
			want, err := planner.RankMemory(pr, layout, c)
			if err != nil {
				t.Fatal(err)
			}
			other, rounding := activationRest(t, rs, c)
			if got := float64(rec.Memory.Activations); got != want.Activations+other+rounding {
				t.Errorf("%s rank %d: activations %.0f bytes; the planner %.0f, the rest it leaves out %.0f, logit rounding %.0f", l, r, got, want.Activations, other, rounding)
			}
			fmt.Fprintf(&table, "| %s | %d | %d (%d, %d, %d) | %s | %s | %s | %s | %s | %s |\n", layoutName(l), l.zero, r, c.DP, c.PP, c.TP,
				mib(rec.Memory.Params, want.Params), mib(rec.Memory.Grads, want.Grads), mib(rec.Memory.Optimizer, want.Optimizer),
				mib(rec.Memory.Activations, want.Activations), mib(rec.Memory.Buffers, want.Buffers), mib(rec.Memory.Total, want.Total))
		}
	}
	t.Logf("measured / planned, MiB:\n%s", table.String())
}

// activationRest is, for the rank at c of the resolved spec s, what its
// activations hold beyond the planner's figure: ActivationUse.Other, and
// on a last stage the logits of its comm.Block of the vocabulary less the
// planner's V/t rows.
func activationRest(t *testing.T, s Spec, c planner.Coord) (other, rounding float64) {
	t.Helper()
	cfg, p, B, T := s.Model.Config, s.Parallel, s.Batch.MicroBatch, s.Batch.Seq
	scratch := backend.CPU{Threads: s.Threads}.AttentionScratch(T)
	if p.ModelParallel() == 1 {
		u, err := model.ActivationUseOf(cfg, B, T, model.RecomputeNone, scratch)
		if err != nil {
			t.Fatal(err)
		}
		return float64(u.Other), 0
	}
	split, err := s.ppSplit()
	if err != nil {
		t.Fatal(err)
	}
	u, err := model.StageActivationUseOf(model.StageShape{Config: cfg, B: B, T: T, TP: p.TP, TPRank: c.TP, SequenceParallel: p.SP(),
		Split: split, Stage: c.PP, InFlight: gridInFlight(s, c.PP)}, scratch)
	if err != nil {
		t.Fatal(err)
	}
	if c.PP == p.PP-1 {
		lo, hi := comm.Block(cfg.Vocab, c.TP, p.TP)
		rounding = 4 * float64(B*T) * (float64(hi-lo) - float64(cfg.Vocab)/float64(p.TP))
	}
	return float64(u.Other), rounding
}

// layoutName is how the table names l.
func layoutName(l gridLayout) string {
	var parts []string
	for _, d := range []struct {
		name string
		n    int
	}{{"TP", l.tp}, {"PP", l.pp}, {"DP", l.dp}} {
		if d.n > 1 {
			parts = append(parts, fmt.Sprintf("%s%d", d.name, d.n))
		}
	}
	if len(parts) == 0 {
		return "1 rank"
	}
	return strings.Join(parts, "·")
}

// mib formats a measured and a planned byte count in MiB.
func mib(got int64, want float64) string {
	return fmt.Sprintf("%.2f / %.2f", float64(got)/(1<<20), want/(1<<20))
}
