package planner

import (
	"strings"
	"testing"
)

// TestZeRO23OnlyWithoutModelParallelism: the free search proposes ZeRO 2
// and 3 only where tp = pp = 1, and a pinned ZeRO 2 or 3 with tp or pp
// above 1 comes back rejected with the reason, as the engine refuses it.
func TestZeRO23OnlyWithoutModelParallelism(t *testing.T) {
	m := Presets["gpt2"].Model
	pr := Problem{Model: m, Topology: cluster(t, "A100-80GB", 8), GlobalBatch: 64, Precision: BF16, Options: DefaultOptions()}
	res, err := Search(pr, Space{})
	if err != nil {
		t.Fatal(err)
	}
	high := 0
	for _, c := range res.Candidates {
		if c.ZeroStage >= 2 {
			high++
			if c.TP*c.PP > 1 {
				t.Errorf("candidate %+v: ZeRO %d proposed with tp %d × pp %d", c.Layout, c.ZeroStage, c.TP, c.PP)
			}
		}
	}
	if high == 0 {
		t.Fatal("no ZeRO 2/3 candidate at all: the check above checked nothing")
	}
	for _, c := range []struct {
		sp   Space
		want string
	}{
		{Space{TP: []int{2}, PP: []int{1}, Zero: []int{2}}, "zero 2 with tp 2: ZeRO-2/3 partition the data-parallel model"},
		{Space{TP: []int{4}, PP: []int{1}, Zero: []int{3}}, "zero 3 with tp 4"},
		{Space{TP: []int{1}, PP: []int{2}, Zero: []int{2}}, "zero 2 with pp 2"},
	} {
		res, err := Search(pr, c.sp)
		if err != nil {
			t.Fatal(err)
		}
		if res.Feasible != 0 || len(res.Candidates) == 0 || !strings.Contains(res.Candidates[0].RejectReason, c.want) {
			t.Errorf("pinned %+v: %d of %d feasible, first reason %q; want none, with %q",
				c.sp, res.Feasible, len(res.Candidates), res.Candidates[0].RejectReason, c.want)
		}
	}
}

// replicatedParams is what every TP rank of a whole model holds in full:
// the norms, the row-parallel biases and GPT's learned positions.
func replicatedParams(m Model) float64 {
	h, l := float64(m.Hidden), float64(m.Layers)
	if m.Arch == ArchLlama {
		return l*2*h + h
	}
	return l*6*h + 2*h + float64(max(m.Positions, m.Seq))*h
}

// TestRankStageTilesTheModel: the parameters every rank of a tp × pp
// model replica holds add up to the model, plus the replicated tensors
// once more on every TP rank but one, plus Megatron's copy of a tied
// embedding on the last stage when pp > 1. Before the planner counted
// per-rank parameters this way it divided everything by tp.
func TestRankStageTilesTheModel(t *testing.T) {
	models := []Model{
		Presets["gpt2"].Model, Presets["llama3-8b"].Model,
		{Arch: ArchGPT, Layers: 5, Hidden: 64, Heads: 4, Vocab: 257, Seq: 16, Positions: 64}, // vocab uneven over tp 2, 4
	}
	n := 0
	for _, m := range models {
		m = m.Normalized()
		for _, tp := range []int{1, 2, 4} {
			for _, pp := range []int{1, 2, 3, 4} {
				sum := 0.0
				for i := range pp {
					for r := range tp {
						sum += rankStage(m, i, pp, tp, r).psi
					}
				}
				want := m.Params() + float64(tp-1)*replicatedParams(m)
				if m.Arch == ArchGPT && pp > 1 {
					want += float64(m.Vocab * m.Hidden)
				}
				if sum != want {
					t.Errorf("%s tp %d pp %d: the ranks hold %.0f parameters, want %.0f", m.Name, tp, pp, sum, want)
				}
				n++
			}
		}
	}
	if n != 3*3*4 {
		t.Fatalf("%d layouts checked", n)
	}
}

// TestRankMemory: a rank's model states are its own parameters, with the
// ZeRO partition of its DP rank (the first ranks own one element more),
// at the bytes the framework keeps; the most loaded rank's is the
// candidate's.
func TestRankMemory(t *testing.T) {
	m := Model{Arch: ArchGPT, Layers: 3, Hidden: 64, Heads: 4, Vocab: 257, Seq: 16}.Normalized()
	top := CPUTopology([]int{8}, 1<<40, 8)
	opts := DefaultOptions()
	opts.States = StateStorage{MPWeights: 4, MPGrads: 4}
	pr := Problem{Model: m, Topology: top, GlobalBatch: 8, Precision: BF16, Options: opts}
	l := Layout{Grid: Grid{TP: 2, PP: 2, DP: 2}, ZeroStage: 1, MicroBatch: 2, Recompute: RecomputeNone}
	var owned float64
	var most Memory
	for _, c := range l.Grid.Coords() {
		mem, err := RankMemory(pr, l, c)
		if err != nil {
			t.Fatal(err)
		}
		psi := rankStage(m, c.PP, l.PP, l.TP, c.TP).psi
		if mem.Params != 4*psi || mem.Grads != 4*psi {
			t.Errorf("rank %+v: params %g, grads %g; want 4 bytes × its %g parameters each", c, mem.Params, mem.Grads, psi)
		}
		owned += mem.Optimizer / 12 // fp32 master weights and two moments per owned element
		if c.DP > 0 {
			if other, _ := RankMemory(pr, l, Coord{PP: c.PP, TP: c.TP}); other.Optimizer-mem.Optimizer > 12 {
				t.Errorf("rank %+v owns %g bytes of optimizer state, its DP rank 0 %g: more than one element apart", c, mem.Optimizer, other.Optimizer)
			}
		}
		if mem.Total > most.Total {
			most = mem
		}
	}
	var all float64
	for i := range l.PP {
		for r := range l.TP {
			all += rankStage(m, i, l.PP, l.TP, r).psi
		}
	}
	if owned != all {
		t.Errorf("the DP ranks own %g elements of optimizer state, want every one of %g once", owned, all)
	}
	if c := Evaluate(pr, l); c.Memory != most {
		t.Errorf("candidate's memory %+v, the most loaded rank's %+v", c.Memory, most)
	}
	// The data-parallel path keeps the precision's 2 bytes.
	l = Layout{Grid: Grid{TP: 1, PP: 1, DP: 8}, ZeroStage: 0, MicroBatch: 1, Recompute: RecomputeNone}
	if mem, _ := RankMemory(pr, l, Coord{}); mem.Params != 2*m.Params() || mem.Grads != 2*m.Params() {
		t.Errorf("tp = pp = 1, bf16: params %g, grads %g; want 2 bytes × %g", mem.Params, mem.Grads, m.Params())
	}
	if _, err := RankMemory(pr, l, Coord{DP: 8}); err == nil || !strings.Contains(err.Error(), "outside the layout") {
		t.Errorf("a rank outside the layout: %v", err)
	}
}

// TestEngineRefusalsAreReasons: layouts the engine refuses at setup are
// rejected by the planner with the reason: sequence parallelism over a
// micro-batch's tokens tp does not divide, and a tp above the vocabulary.
func TestEngineRefusalsAreReasons(t *testing.T) {
	m := Model{Arch: ArchGPT, Layers: 2, Hidden: 12, Heads: 4, Vocab: 3, Seq: 3}.Normalized()
	top := CPUTopology([]int{4}, 1<<40, 4)
	pr := Problem{Model: m, Topology: top, GlobalBatch: 4, Precision: FP32, Options: DefaultOptions()}
	for _, c := range []struct {
		l    Layout
		want string
	}{
		{Layout{Grid: Grid{TP: 2, PP: 1, DP: 2}, MicroBatch: 1, Recompute: RecomputeNone}, "sequence parallelism splits micro_batch × seq = 1 × 3 tokens over tp 2"},
		{Layout{Grid: Grid{TP: 4, PP: 1, DP: 1}, MicroBatch: 4, Recompute: RecomputeNone}, "tp 4 exceeds the vocabulary of 3 tokens"},
	} {
		if got := Evaluate(pr, c.l); got.Feasible || !strings.Contains(got.RejectReason, c.want) {
			t.Errorf("%+v: feasible %v, reason %q; want %q", c.l, got.Feasible, got.RejectReason, c.want)
		}
	}
	pr.Options.SequenceParallel = false
	if got := Evaluate(pr, Layout{Grid: Grid{TP: 2, PP: 1, DP: 2}, MicroBatch: 1, Recompute: RecomputeNone}); !got.Feasible {
		t.Errorf("tp 2 without sequence parallelism: %s", got.RejectReason)
	}
}
