package train

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/model"
)

// gridLayout is a tensor-, pipeline- and data-parallel layout of the
// tests: its degrees, the ZeRO stage, and what is not the default.
type gridLayout struct {
	tp, pp, dp, zero int
	noSP             bool  // tp > 1 without sequence parallelism
	ppLayers         []int // an explicit split
}

func (l gridLayout) String() string {
	s := fmt.Sprintf("tp%d/pp%d/dp%d/zero%d", l.tp, l.pp, l.dp, l.zero)
	if l.noSP {
		s += "/nosp"
	}
	if l.ppLayers != nil {
		s += fmt.Sprintf("/layers%v", l.ppLayers)
	}
	return s
}

// gridSpec is a job whose model takes every layout of the tests: 4 heads
// (tp 1, 2, 4), 3 layers (pp 2 splits them 1+2, unevenly; pp 3), the test
// preset's vocabulary of 257 (uneven over tp 2 and 4), 3 micro-batches a
// step (the 1F1B schedule of 2 and 3 stages has a steady state), and a
// global batch of 4 sequences of 16 tokens, divided over l.dp replicas.
func gridSpec(l gridLayout) Spec {
	s := smallSpec("")
	s.Model = ModelSpec{Preset: "test", Config: model.Config{Layers: 3, Heads: 4}}
	s.Checkpoint, s.Eval = CkptSpec{}, EvalSpec{Every: 2, Batches: 2}
	s.Steps, s.Threads = 4, 1
	s.Batch = BatchSpec{MicroBatch: 4 / l.dp, Seq: 16, GradAccum: 3}
	p := &s.Parallel
	p.TP, p.PP, p.ZeroStage, p.PPLayers = l.tp, l.pp, l.zero, l.ppLayers
	if l.noSP {
		off := false
		p.SequenceParallel = &off
	}
	return s
}

// gridTol bounds the relative difference of the loss between a tensor- and
// pipeline-parallel run and one rank on the same global batch, over 4
// steps. Pipeline parallelism changes no sum (each stage runs the
// micro-batches in order); tensor parallelism splits the reductions of the
// row-parallel layers (an all-reduce adds the TP ranks' partial sums), of
// the vocabulary-parallel cross-entropy and, under sequence parallelism,
// of the LayerNorm gradients, and DP adds the replicas' gradients: each a
// reordering of float32 sums, about one ulp (6e-8) per operation, which
// AdamW carries into the parameters at a similar relative size. Measured:
// at most 9.5e-8 here (0 for many layouts); the bound leaves a factor of 10.
const gridTol = 1e-6

// sameLosses fails unless every rank of res reports the same losses, as
// many as ref, and returns their largest relative difference to ref.
func sameLosses(t *testing.T, res []Result, ref []float32) float64 {
	t.Helper()
	worst := 0.0
	if len(res[0].Losses) != len(ref) {
		t.Fatalf("%d losses, want %d", len(res[0].Losses), len(ref))
	}
	for i, want := range ref {
		for r := range res {
			if res[r].Losses[i] != res[0].Losses[i] {
				t.Fatalf("step %d: rank %d loss %v, rank 0 %v: ranks disagree", i+1, r, res[r].Losses[i], res[0].Losses[i])
			}
		}
		worst = max(worst, relDiff(res[0].Losses[i], want))
	}
	return worst
}

// TestGridCheckpointReshards: a tp2·pp2 run checkpointed at step 4 of 8
// resumes on dp4 (data parallelism and ZeRO, today's path), on tp4 and on
// one rank, with the Adam moments restored from the parts: the losses of
// steps 5 to 8 continue the uninterrupted tp2·pp2 run within gridTol. A
// dp2 checkpoint resumes on tp2·pp2 as well.
func TestGridCheckpointReshards(t *testing.T) {
	spec := func(l gridLayout, dir string) Spec {
		s := gridSpec(l)
		s.Steps, s.Checkpoint = 8, CkptSpec{Dir: dir, Every: 4}
		s.Optim.WarmupSteps = 2
		return s
	}
	from := gridLayout{tp: 2, pp: 2, dp: 1, zero: 1}
	full := runRanks(t, spec(from, t.TempDir()), 4, nil)[0].Losses
	dir := t.TempDir()
	runRanks(t, spec(from, dir), 4, func(e *Env) { e.StopAfter = 4 })
	fromDP := gridLayout{tp: 1, pp: 1, dp: 2, zero: 0}
	dpDir := t.TempDir()
	runRanks(t, spec(fromDP, dpDir), 2, func(e *Env) { e.StopAfter = 4 })
	for _, c := range []struct {
		name string
		dir  string
		to   gridLayout
	}{
		{"tp2pp2-to-dp4", dir, gridLayout{tp: 1, pp: 1, dp: 4, zero: 1}},
		{"tp2pp2-to-tp4", dir, gridLayout{tp: 4, pp: 1, dp: 1, zero: 0}},
		{"tp2pp2-to-one-rank", dir, gridLayout{tp: 1, pp: 1, dp: 1}},
		{"dp2-to-tp2pp2", dpDir, gridLayout{tp: 2, pp: 2, dp: 1, zero: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			work := filepath.Join(t.TempDir(), "run")
			if err := os.CopyFS(work, os.DirFS(c.dir)); err != nil {
				t.Fatal(err)
			}
			// The checkpoint's spec with tp and pp set, as gtrain resume
			// --set gives it: dp and the micro-batch are the writer's.
			s := spec(c.to, work)
			src := from
			if c.dir == dpDir {
				src = fromDP
			}
			s.Parallel.DP, s.Batch.MicroBatch = src.dp, 4/src.dp
			n := c.to.tp * c.to.pp * c.to.dp
			res := runRanks(t, s, n, func(e *Env) { e.Resume = true })
			if res[0].Resumed != 4 {
				t.Fatalf("resumed from step %d, want 4", res[0].Resumed)
			}
			worst := sameLosses(t, res, full[4:])
			t.Logf("largest relative loss difference to the uninterrupted run: %.2g", worst)
			if worst > gridTol {
				t.Errorf("losses after resume %v, uninterrupted %v: relative difference %.2g > %g", res[0].Losses, full[4:], worst, gridTol)
			}
		})
	}
}

// TestGridSpecRefusals: a layout the model cannot split, and what the
// engine does not run with tp·pp > 1, are refused before any rank
// starts, naming the key and what to use instead; tp = pp = 1 keeps
// accepting what it always did.
func TestGridSpecRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Spec)
		want string // "" for no error
	}{
		{"tp divides heads", func(s *Spec) { s.Parallel.TP = 3 }, "job: parallel.tp 3: does not divide the model's 4 attention heads (model.heads)"},
		{"pp above layers", func(s *Spec) { s.Parallel.PP = 4 }, "job: parallel.pp 4: more pipeline stages than the model's 3 layers (model.layers)"},
		{"vocab below tp", func(s *Spec) { s.Model.Vocab = 2; s.Parallel.TP = 4 }, "job: parallel.tp 4: more than the model's vocabulary of 2 tokens (model.vocab)"},
		{"pp_layers sum", func(s *Spec) { s.Parallel.PP = 2; s.Parallel.PPLayers = []int{1, 1} }, "job: parallel.pp_layers: pipeline: pp_layers [1 1]: adds up to 2 layers, not the model's 3"},
		{"sp tokens", func(s *Spec) { s.Parallel.TP = 4; s.Batch = BatchSpec{MicroBatch: 1, Seq: 3, GradAccum: 1} }, "job: batch.micro_batch 1 × batch.seq 3 = 3 tokens do not divide over parallel.tp 4, as sequence parallelism needs"},
		{"sp off", func(s *Spec) {
			off := false
			s.Parallel.TP, s.Parallel.SequenceParallel = 4, &off
			s.Batch = BatchSpec{MicroBatch: 1, Seq: 3, GradAccum: 1}
		}, ""},
		{"bf16", func(s *Spec) { s.Parallel.PP = 2; s.Precision = "bf16" }, ""},
		{"fp16", func(s *Spec) { s.Parallel.TP = 2; s.Precision = "fp16" }, ""},
		{"zero 2", func(s *Spec) { s.Parallel.TP = 2; s.Parallel.ZeroStage = 2 }, "job: parallel.zero_stage 2 with parallel.tp 2 × parallel.pp 1: ZeRO stages 2 and 3 do not combine"},
		{"recompute", func(s *Spec) { s.Parallel.TP = 2; s.Recompute = "full" }, ""},
		{"interleaved", func(s *Spec) { s.Parallel.PP = 2; s.Parallel.VirtualStages = 2 }, "job: parallel.virtual_stages 2: parallel.pp 2 × 2 = 4 model chunks, more than the model's 3 layers (model.layers): set parallel.virtual_stages to 1"},
		{"dp path keeps bf16 and zero 3", func(s *Spec) { s.Precision = "bf16"; s.Parallel.ZeroStage = 3; s.Recompute = "full" }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := gridSpec(gridLayout{tp: 1, pp: 1, dp: 1})
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

// TestGridNeedsRanksOfTheLayout: a run whose rank count tp × pp does not
// divide fails naming the keys, on every rank, before any group forms.
func TestGridNeedsRanksOfTheLayout(t *testing.T) {
	s := gridSpec(gridLayout{tp: 2, pp: 2, dp: 1})
	_, err := fitDP(s, Env{World: 6})
	if err == nil || !strings.Contains(err.Error(), "parallel.tp 2 × parallel.pp 2 = 4 ranks per model replica do not divide the run's 6 ranks") {
		t.Fatalf("fitDP on 6 ranks: %v", err)
	}
}

// TestGridPreemptResumesExactly: in a tp2·pp2 run, only the last stage's
// TP rank 1 is preempted, before step 4: every rank stops after step 4
// and saves there (the flag rides on the loss's all-reduce), and resumed
// on the same layout the run continues with exactly the losses of an
// uninterrupted one: parameters, Adam moments, step and sampler restored.
func TestGridPreemptResumesExactly(t *testing.T) {
	s := gridSpec(gridLayout{tp: 2, pp: 2, dp: 1, zero: 1})
	s.Steps, s.Optim.WarmupSteps = 8, 2
	full := runRanks(t, s, 4, nil)[0].Losses
	dir := t.TempDir()
	s.Checkpoint = CkptSpec{Dir: dir, Every: 100}
	preempt := make(chan struct{})
	setHook(t, &testHookStep, func(tr *Trainer) {
		if tr.spec.Checkpoint.Dir == dir && tr.env.Rank == 3 && tr.step == 3 {
			close(preempt)
		}
	})
	res := runRanks(t, s, 4, func(e *Env) {
		if e.Rank == 3 {
			e.Preempt = preempt
		}
	})
	for r, res := range res {
		if !res.Preempted || res.Steps != 4 || res.Checkpoint != filepath.Join(dir, ckpt.StepDirName(4)) {
			t.Fatalf("rank %d: preempted %v after step %d, checkpoint %q; want preempted after step 4 with its checkpoint", r, res.Preempted, res.Steps, res.Checkpoint)
		}
	}
	testHookStep = nil
	resumed := runRanks(t, s, 4, func(e *Env) { e.Resume = true })
	if resumed[0].Resumed != 4 || !slices.Equal(resumed[0].Losses, full[4:]) {
		t.Errorf("resumed from step %d with losses %v; want step 4 and exactly %v", resumed[0].Resumed, resumed[0].Losses, full[4:])
	}
	sameLosses(t, resumed, full[4:])
}

// TestGridEvaluatesInChunks: validation batches beyond evalChunk run as
// several schedules, with the loss of one rank evaluating them all.
func TestGridEvaluatesInChunks(t *testing.T) {
	s := gridSpec(gridLayout{tp: 1, pp: 2, dp: 1})
	s.Steps, s.Eval = 1, EvalSpec{Every: 1, Batches: 5}
	single := s
	single.Parallel.PP = 1
	ref := runRanks(t, single, 1, nil)[0].ValLoss
	defer func(n int) { evalChunk = n }(evalChunk)
	evalChunk = 2
	got := runRanks(t, s, 2, nil)
	if ref == 0 || relDiff(got[0].ValLoss, ref) > gridTol || got[1].ValLoss != got[0].ValLoss {
		t.Errorf("validation loss %v and %v over 5 batches in chunks of 2, single rank %v", got[0].ValLoss, got[1].ValLoss, ref)
	}
}
