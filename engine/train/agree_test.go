package train

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/zero"
	"github.com/gtrain/gtrain/planner"
)

// agreeRanks is the world of the agreement test: 8 ranks on one host make
// tp 1, 2 and 4, pp 1, 2 and 4, and dp 1 to 8.
const agreeRanks = 8

// agreeSpec is a one-step job on a model whose layouts cover what the
// engine runs: 4 heads (tp 1, 2, 4), 5 layers (pp 2 splits them 2+3 and
// pp 4 1+1+1+2, unevenly), a vocabulary of 257 (uneven over tp 2 and 4),
// training sequences of 8 tokens in a model of 16 positions (the position
// embedding is the model's, not the batch's), and a global batch of 8
// sequences.
func agreeSpec(precision string) Spec {
	s := smallSpec("")
	s.Model = ModelSpec{Preset: "test", Config: model.Config{Layers: 5, Heads: 4, Embd: 32, Seq: 16}}
	s.Checkpoint, s.Eval = CkptSpec{}, EvalSpec{}
	s.Steps, s.Threads, s.Precision = 1, 1, precision
	s.Data.Synthetic = 4_000
	s.Batch = BatchSpec{MicroBatch: 1, Seq: 8, GradAccum: 8 / agreeRanks}
	return s
}

// agreeKey is what a candidate's memory and behaviour depend on beyond its
// grid, ZeRO stage and recomputation: whether its micro-batch is the
// smallest or the largest of its layout (activations grow linearly in
// between), and so how many micro-batches 1F1B keeps in flight.
type agreeKey struct {
	planner.Grid
	zero    int
	rc      planner.Recompute
	largest bool
}

// agreeCandidates is every feasible candidate of the engine's search of
// spec on agreeRanks ranks of ample memory, with only the smallest and
// largest micro-batch of each grid, ZeRO stage and recomputation mode.
func agreeCandidates(t *testing.T, spec Spec) (planner.Problem, []planner.Candidate) {
	t.Helper()
	pr, err := enginePlan(spec, planner.CPUTopology([]int{agreeRanks}, 1<<40, agreeRanks))
	if err != nil {
		t.Fatal(err)
	}
	res, err := planner.Search(pr, planner.Space{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Feasible != len(res.Candidates) {
		t.Fatalf("%d of %d candidates feasible with ample memory: the first rejected: %s", res.Feasible, len(res.Candidates), res.Candidates[res.Feasible].RejectReason)
	}
	picked := map[agreeKey]int{}
	var cs []planner.Candidate
	for _, c := range res.Candidates {
		for _, largest := range []bool{false, true} {
			k := agreeKey{c.Grid, c.ZeroStage, c.Recompute, largest}
			i, ok := picked[k]
			switch {
			case !ok:
				picked[k] = len(cs)
				cs = append(cs, c)
			case largest && c.MicroBatch > cs[i].MicroBatch, !largest && c.MicroBatch < cs[i].MicroBatch:
				cs[i] = c
			}
		}
	}
	return pr, dedupe(cs)
}

// dedupe drops repeated layouts (the smallest micro-batch of a layout
// that has only one is also its largest).
func dedupe(cs []planner.Candidate) []planner.Candidate {
	seen := map[planner.Layout]bool{}
	var out []planner.Candidate
	for _, c := range cs {
		if !seen[c.Layout] {
			seen[c.Layout] = true
			out = append(out, c)
		}
	}
	return out
}

// TestPlannerAgreesWithEngine is issue 15's "gtrain plan and the engine
// agree on every degree, mode and memory term": every layout the planner
// proposes for the engine (tp, pp, dp, ZeRO stage, micro-batch,
// recomputation) on 8 ranks is built as --auto builds it and trains one
// step on 8 in-process ranks, in fp32 and bf16: the engine accepts it,
// runs that layout (the log's layout, each rank's coordinates), and each
// rank's reported parameters, gradients, optimizer state and activations
// are the planner's figures for that rank (planner.RankMemory; see
// compareMemory for the two places they cannot be equal).
func TestPlannerAgreesWithEngine(t *testing.T) {
	for _, prec := range []string{"fp32", "bf16"} {
		spec := agreeSpec(prec)
		pr, cs := agreeCandidates(t, spec)
		grids, zeros, modes := map[planner.Grid]bool{}, map[int]bool{}, map[planner.Recompute]bool{}
		for _, c := range cs {
			grids[c.Grid], zeros[c.ZeroStage], modes[c.Recompute] = true, true, true
		}
		// tp 1/2/4 × pp 1/2/4 with tp·pp·dp = 8 and pp ≤ 5 layers, ZeRO 0–3
		// and every recomputation mode.
		if len(grids) != 8 || len(zeros) != 4 || len(modes) != len(planner.Recomputes) {
			t.Fatalf("%s: %d candidates on grids %v, ZeRO %v, recompute %v: want every grid of 8 ranks, stage and mode", prec, len(cs), grids, zeros, modes)
		}
		for _, c := range cs {
			name := fmt.Sprintf("%s/tp%d/pp%d/dp%d/zero%d/mb%d/%s", prec, c.TP, c.PP, c.DP, c.ZeroStage, c.MicroBatch, c.Recompute)
			t.Run(name, func(t *testing.T) { checkAgreement(t, pr, withLayout(spec, c), c) })
		}
	}
}

// checkAgreement trains spec, candidate c laid out, for one step and
// compares what the ranks report with the planner.
func checkAgreement(t *testing.T, pr planner.Problem, spec Spec, c planner.Candidate) {
	if err := spec.Validate(); err != nil {
		t.Fatalf("the engine refuses the candidate: %v", err)
	}
	var recs statusRecords
	var log lockedBuffer
	runRanks(t, spec, agreeRanks, func(e *Env) {
		recs.env(e)
		e.Log = &log
	})
	if want := layoutText(c, spec.Model.Config.Layers); !strings.Contains(log.String(), want) {
		t.Errorf("the engine's log does not name the layout %q:\n%s", want, log.String())
	}
	for r := range agreeRanks {
		rec := recs.of(t, r)
		if len(rec) != 1 {
			t.Fatalf("rank %d: %d status records for one step", r, len(rec))
		}
		coord := c.Grid.Coord(r)
		if mp := c.TP*c.PP > 1; mp && (rec[0].Coord == nil || *rec[0].Coord != coord) || !mp && rec[0].Coord != nil {
			t.Errorf("rank %d: coordinates %+v, want %+v", r, rec[0].Coord, coord)
		}
		want, err := planner.RankMemory(pr, c.Layout, coord)
		if err != nil {
			t.Fatal(err)
		}
		compareMemory(t, r, spec, c, rec[0].Memory, want)
	}
}

// compareMemory holds rank r's reported memory to the planner's (the
// buffers excepted: the planner's are Megatron-LM's NCCL buckets, the
// engine's its own pool). With tp·pp > 1 the model states are equal: the planner counts each tensor part a
// Megatron-style rank holds (planner.RankMemory) and the distributed
// optimizer's one partition is comm.Block's, as the planner's. On the
// data-parallel path ZeRO partitions each gradient bucket (ZeRO 1–2) or
// each layer (ZeRO 3) by comm.Block, where the planner splits the model
// once: every segment may give the rank one element more or less than the
// even split, so the owned part differs by less than the segments.
func compareMemory(t *testing.T, r int, spec Spec, c planner.Candidate, got MemoryUse, want planner.Memory) {
	t.Helper()
	slack := 0.0
	if c.TP*c.PP == 1 && c.ZeroStage > 0 {
		slack = float64(segmentsOf(t, spec)) * 16 // the most bytes per element of any state
	}
	for _, m := range []struct {
		name      string
		got, want float64
	}{
		{"params", float64(got.Params), want.Params},
		{"grads", float64(got.Grads), want.Grads},
		{"optimizer", float64(got.Optimizer), want.Optimizer},
	} {
		if d := m.got - m.want; d > slack || d < -slack {
			t.Errorf("rank %d (%+v): %s %.0f bytes, the planner %.0f (tolerance %.0f)", r, c.Grid.Coord(r), m.name, m.got, m.want, slack)
		}
	}
	// Activations: the planner's figure is the part of what the rank holds
	// that it counts (layers × micro-batches in flight, the head, the
	// working set); the rest (LayerNorm statistics, per-token losses,
	// backward's scratch: ActivationUse.Other) it leaves to its margin, and
	// it takes a last stage's logits as V/t rows where comm.Block gives
	// the rank ⌊V/t⌋ or ⌈V/t⌉. Beyond those two, exactly.
	other, rounding := activationRestOf(t, spec, c, c.Grid.Coord(r))
	if a := float64(got.Activations); a != want.Activations+other+rounding {
		t.Errorf("rank %d (%+v): activations %.0f bytes; the planner %.0f, the rest it leaves out %.0f, logit rounding %.0f",
			r, c.Grid.Coord(r), a, want.Activations, other, rounding)
	}
}

// activationRestOf is activationRest (TestEngineMemoryVsPlanner's) for
// candidate c's recomputation mode: what the rank at coord holds beyond
// the planner's activations.
func activationRestOf(t *testing.T, spec Spec, c planner.Candidate, coord planner.Coord) (other, rounding float64) {
	t.Helper()
	s, err := spec.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = fitDP(s, Env{World: agreeRanks}); err != nil {
		t.Fatal(err)
	}
	cfg, p, B, T := s.Model.Config, s.Parallel, s.Batch.MicroBatch, s.Batch.Seq
	rc := model.Recompute(c.Recompute)
	scratch := backend.CPU{Threads: s.Threads}.AttentionScratch(T)
	if p.ModelParallel() == 1 {
		u, err := model.ActivationUseOf(cfg, B, T, rc, scratch)
		if err != nil {
			t.Fatal(err)
		}
		return float64(u.Other), 0
	}
	split, err := s.ppSplit()
	if err != nil {
		t.Fatal(err)
	}
	u, err := model.StageActivationUseOf(model.StageShape{Config: cfg, B: B, T: T, TP: p.TP, TPRank: coord.TP, SequenceParallel: p.SP(),
		Split: split, Stage: coord.PP, Recompute: rc, InFlight: gridInFlight(s, coord.PP)}, scratch)
	if err != nil {
		t.Fatal(err)
	}
	if coord.PP == p.PP-1 {
		lo, hi := comm.Block(cfg.Vocab, coord.TP, p.TP)
		rounding = 4 * float64(B*T) * (float64(hi-lo) - float64(cfg.Vocab)/float64(p.TP))
	}
	return float64(u.Other), rounding
}

// segmentsOf is how many pieces the data-parallel path's ZeRO partition
// cuts the model into for spec (see zero's partition).
func segmentsOf(t *testing.T, spec Spec) int {
	t.Helper()
	res, err := spec.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	zc, err := res.ZeroConfig()
	if err != nil {
		t.Fatal(err)
	}
	units := res.Model.Config.Units()
	if zc.Stage == 3 {
		return len(zero.PerUnit(units))
	}
	return len(zero.Buckets(units, zc.FirstBucket, zc.Bucket))
}

// layoutText is how the engine's first log line names c's layout of a
// model of layers layers.
func layoutText(c planner.Candidate, layers int) string {
	if c.TP*c.PP == 1 {
		return fmt.Sprintf("dp %d, ZeRO stage %d,", c.DP, c.ZeroStage)
	}
	return fmt.Sprintf("tp %d, pp %d (1F1B, layers %v), dp %d", c.TP, c.PP, planner.StageLayers(layers, c.PP), c.DP)
}

// lockedBuffer is a bytes.Buffer the ranks may write concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
