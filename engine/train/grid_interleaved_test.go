package train

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

// interleavedSpec is equivSpec for l with v model chunks per pipeline
// rank (0 or 1: 1F1B) on a model the interleaved schedule takes: 5 layers
// (pp 2 × v 2 splits them 1+1+1+2, unevenly), 4 micro-batches a step (a
// multiple of pp 2, and more than it: the schedule reaches its steady
// state), and 3 validation batches, which evaluation pads to 4.
func interleavedSpec(l gridLayout, v int, dir string) Spec {
	s := equivSpec(l, dir)
	s.Model.Config.Layers = 5
	s.Batch.GradAccum = 4
	s.Eval.Batches = 3
	s.Parallel.VirtualStages = v
	return s
}

// TestGridInterleavedMatchesSingleRank: with parallel.virtual_stages 2
// (Megatron-LM's interleaved schedule, 2 model chunks per rank) on pp 2
// alone, with tp 2, and with dp 2, at ZeRO 0 and 1, every rank reports
// the same loss at every step, within gridTol of one rank training on the
// same global batch; so is the validation loss (through the padded
// interleaved schedule) where the micro-batch is the single rank's; the
// gradients after the first step match the single rank's within
// gridGradTol; and each rank's status records report the activations its
// chunks hold, exactly what EstimateMemory counted for it.
func TestGridInterleavedMatchesSingleRank(t *testing.T) {
	refs := map[int]Result{}
	refGrads := map[int]map[string][]float32{}
	for _, l := range []gridLayout{
		{tp: 1, pp: 2, dp: 1, zero: 0},
		{tp: 2, pp: 2, dp: 1, zero: 1},
		{tp: 1, pp: 2, dp: 2, zero: 1},
	} {
		rows := gridRows(l.dp)
		if _, ok := refs[rows]; !ok {
			s := interleavedSpec(gridLayout{tp: 1, pp: 1, dp: 1}, 0, t.TempDir())
			s.Batch.MicroBatch = rows
			refs[rows] = runRanks(t, s, 1, nil)[0]
			refGrads[rows] = firstGrads(t, s.Checkpoint.Dir)
		}
		t.Run(l.String()+"/v2", func(t *testing.T) {
			one, n := refs[rows], l.tp*l.pp*l.dp
			s := interleavedSpec(l, 2, t.TempDir())
			res, recs := runWithStatus(t, s, n)
			worst := sameLosses(t, res, one.Losses)
			t.Logf("largest relative loss difference over %d steps: %.2g", len(one.Losses), worst)
			if worst > gridTol {
				t.Errorf("losses %v, single rank %v: relative difference %.2g > %g", res[0].Losses, one.Losses, worst, gridTol)
			}
			sameGrads(t, firstGrads(t, s.Checkpoint.Dir), refGrads[rows])
			for r := range n {
				if d := relDiff(res[r].ValLoss, one.ValLoss); one.ValLoss == 0 || res[r].ValLoss != res[0].ValLoss || l.dp == 1 && d > gridTol {
					t.Errorf("rank %d: validation loss %v, rank 0 %v, single rank %v", r, res[r].ValLoss, res[0].ValLoss, one.ValLoss)
				}
			}
			checkGridMemory(t, s, recs)
		})
	}
}

// TestGridInterleavedCheckpointResumes: a pp2 run with 2 chunks per rank,
// checkpointed at step 4 of 8, resumes on pp 2 with the 1F1B schedule (one
// chunk per rank) and on one rank, and a one-rank checkpoint resumes on
// tp2·pp2 with 2 chunks: the tensors are saved whole-model by name,
// whatever holds them, and the losses of steps 5 to 8 continue the
// uninterrupted run within gridTol.
func TestGridInterleavedCheckpointResumes(t *testing.T) {
	spec := func(l gridLayout, v int, dir string) Spec {
		s := interleavedSpec(l, v, dir)
		s.Steps, s.Checkpoint = 8, CkptSpec{Dir: dir, Every: 4}
		s.Optim.WarmupSteps = 2
		return s
	}
	pp2 := gridLayout{tp: 1, pp: 2, dp: 1, zero: 1}
	one := gridLayout{tp: 1, pp: 1, dp: 1}
	full := runRanks(t, spec(pp2, 2, t.TempDir()), 2, nil)[0].Losses
	if len(full) != 8 {
		t.Fatalf("%d losses, want 8", len(full))
	}
	v2Dir, oneDir := t.TempDir(), t.TempDir()
	runRanks(t, spec(pp2, 2, v2Dir), 2, func(e *Env) { e.StopAfter = 4 })
	runRanks(t, spec(one, 0, oneDir), 1, func(e *Env) { e.StopAfter = 4 })
	for _, c := range []struct {
		from, dir string
		to        gridLayout
		v         int
	}{
		{"pp2v2", v2Dir, pp2, 1},
		{"pp2v2", v2Dir, one, 0},
		{"one-rank", oneDir, gridLayout{tp: 2, pp: 2, dp: 1, zero: 1}, 2},
	} {
		t.Run(fmt.Sprintf("%s-to-%s/v%d", c.from, c.to, c.v), func(t *testing.T) {
			work := filepath.Join(t.TempDir(), "run")
			if err := os.CopyFS(work, os.DirFS(c.dir)); err != nil {
				t.Fatal(err)
			}
			res := runRanks(t, spec(c.to, c.v, work), c.to.tp*c.to.pp, func(e *Env) { e.Resume = true })
			if res[0].Resumed != 4 {
				t.Fatalf("resumed from step %d, want 4", res[0].Resumed)
			}
			if worst := sameLosses(t, res, full[4:]); worst > gridTol {
				t.Errorf("losses after resume %v, uninterrupted %v: relative difference %.2g > %g", res[0].Losses, full[4:], worst, gridTol)
			}
		})
	}
}

// TestGridInterleavedRefuses: virtual stages the interleaved schedule
// cannot run are refused before any rank starts, saying what to use
// instead; those it can run are not.
func TestGridInterleavedRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Spec)
		want string
	}{
		{"runs", func(s *Spec) {}, ""},
		{"explicit split per virtual stage", func(s *Spec) { s.Parallel.PPLayers = []int{2, 1, 1, 1} }, ""},
		{"one pipeline stage", func(s *Spec) { s.Parallel.PP = 1 }, "job: parallel.virtual_stages 2 with parallel.pp 1: the interleaved schedule needs at least 2 pipeline stages: set parallel.pp to 2 or more, or parallel.virtual_stages to 1"},
		{"micro-batches not a multiple of pp", func(s *Spec) { s.Batch.GradAccum = 3 }, "job: parallel.virtual_stages 2: batch.grad_accum 3 micro-batches is not a multiple of parallel.pp 2, as the interleaved schedule needs (Megatron-LM's rule): set batch.grad_accum to a multiple of 2, or parallel.virtual_stages to 1"},
		{"chunks above the layers", func(s *Spec) { s.Parallel.VirtualStages = 3 }, "job: parallel.virtual_stages 3: parallel.pp 2 × 3 = 6 model chunks, more than the model's 5 layers (model.layers): choose virtual_stages of at most 2"},
		{"split per pipeline stage", func(s *Spec) { s.Parallel.PPLayers = []int{3, 2} }, "job: parallel.pp_layers (one count per virtual stage, pp × virtual_stages = 4): pipeline: pp_layers [3 2]: 2 counts for 4 stages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := interleavedSpec(gridLayout{tp: 1, pp: 2, dp: 1}, 2, "")
			s.Checkpoint = CkptSpec{}
			c.set(&s)
			err := s.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
				t.Fatalf("error %v, want one starting %q", err, c.want)
			}
		})
	}
}

// TestAutoLayoutKeepsVirtualStages: run --auto sets parallel.virtual_stages
// from the planner's candidate, so the engine runs the schedule whose
// bubble and activations the planner counted, and the spec it makes is
// one the engine takes.
func TestAutoLayoutKeepsVirtualStages(t *testing.T) {
	spec := interleavedSpec(gridLayout{tp: 1, pp: 1, dp: 1}, 0, "")
	spec.Checkpoint = CkptSpec{}
	c := planner.Candidate{Layout: planner.Layout{Grid: planner.Grid{TP: 1, PP: 2, DP: 1}, MicroBatch: 4, Recompute: planner.RecomputeNone, VirtualStages: 2}, GradAccum: 4}
	s := withLayout(spec, c)
	if s.Parallel.VirtualStages != 2 || s.Parallel.PP != 2 {
		t.Fatalf("pp %d, virtual stages %d; want the candidate's 2 and 2", s.Parallel.PP, s.Parallel.VirtualStages)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("the engine refuses the candidate: %v", err)
	}
}
