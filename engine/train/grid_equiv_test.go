package train

import (
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/zero"
)

// gridRows is the number of sequences per micro-step (micro-batch × dp)
// of the equivalence tests' global batch for dp replicas: 4 where dp
// divides it (the batch every other grid test uses), else dp, one
// sequence per replica, so that every dp up to 8 has a global batch, each
// compared with one rank training on that same batch.
func gridRows(dp int) int {
	if 4%dp == 0 {
		return 4
	}
	return dp
}

// everyLayout lists every (tp, pp, dp) with tp·pp·dp ≤ 8 that the model
// of gridSpec takes, at ZeRO 0 and 1: tp dividing its 4 heads (1, 2, 4),
// pp up to its 3 layers (pp 2 splits them 1+2, unevenly), any dp; and,
// beyond the defaults, tp 2 without sequence parallelism and pp 2 split
// 2+1 explicitly.
func everyLayout() []gridLayout {
	spec := gridSpec(gridLayout{tp: 1, pp: 1, dp: 1}).Model.Config
	var base []gridLayout
	for tp := 1; tp <= 8; tp++ {
		for pp := 1; tp*pp <= 8 && pp <= spec.Layers; pp++ {
			for dp := 1; tp*pp*dp <= 8; dp++ {
				if spec.Heads%tp == 0 {
					base = append(base, gridLayout{tp: tp, pp: pp, dp: dp})
				}
			}
		}
	}
	base = append(base, gridLayout{tp: 2, pp: 1, dp: 1, noSP: true}, gridLayout{tp: 1, pp: 2, dp: 1, ppLayers: []int{2, 1}})
	var ls []gridLayout
	for _, l := range base {
		for z := range 2 {
			l.zero = z
			ls = append(ls, l)
		}
	}
	return ls
}

// everyLayoutCount is len(everyLayout()): 24 degree triples (tp 1: 8 + 4
// + 2 over pp 1, 2, 3; tp 2: 4 + 2 + 1; tp 4: 2 + 1), 2 variants, each at
// 2 ZeRO stages. A change of the model that drops layouts fails here
// rather than testing fewer in silence.
const everyLayoutCount = (24 + 2) * 2

// gridGradTol bounds, for each tensor, the largest difference of an
// element's gradient after the first step between a layout and one rank,
// relative to the tensor's largest gradient (elements near 0 have no
// meaningful relative error of their own). The sums that differ are those
// of gridTol's comment (and, for one micro-batch per replica, the GEMMs'
// blocking), with nothing of AdamW's normalisation to damp them: measured
// at most 8.6e-7 (dp 7, whose average over 7 replicas rounds), 1.8e-7
// for pipeline parallelism alone; the bound leaves a factor of 10. A
// gradient counted twice, or missing a rank's part, is off by about its
// own size (a relative difference near 1).
const gridGradTol = 1e-5

// equivSpec is gridSpec for l on the global batch of gridRows, with a
// checkpoint at every step, whose first one holds the first step's
// gradients (see firstGrads).
func equivSpec(l gridLayout, dir string) Spec {
	s := gridSpec(l)
	s.Batch.MicroBatch = gridRows(l.dp) / l.dp
	s.Checkpoint = CkptSpec{Dir: dir, Every: 1}
	return s
}

// TestGridMatchesSingleRank: on every layout of everyLayout, the
// combinations of tensor, pipeline and data parallelism (uneven splits of
// layers and vocabulary, with and without sequence parallelism) at ZeRO 0
// and 1, every rank reports the same loss at every step, equal within
// gridTol to that of one rank training on the same global batch; so is
// the validation loss (evaluated through the pipeline) where the
// micro-batch, which sizes the validation batches, is the single rank's;
// the gradient of every parameter after the first step, assembled from
// the whole layout, equals the single rank's within gridGradTol; and the
// status records of tp·pp > 1 carry each rank's coordinates.
func TestGridMatchesSingleRank(t *testing.T) {
	layouts := everyLayout()
	if len(layouts) != everyLayoutCount {
		t.Fatalf("%d layouts, want %d", len(layouts), everyLayoutCount)
	}
	refs := map[int]Result{} // the single rank's run, by gridRows
	refGrads := map[int]map[string][]float32{}
	for _, l := range layouts {
		rows := gridRows(l.dp)
		if _, ok := refs[rows]; !ok {
			one := gridLayout{tp: 1, pp: 1, dp: 1}
			s := equivSpec(one, t.TempDir())
			s.Batch.MicroBatch = rows
			refs[rows] = runRanks(t, s, 1, nil)[0]
			refGrads[rows] = firstGrads(t, s.Checkpoint.Dir)
		}
		t.Run(l.String(), func(t *testing.T) {
			checkEquivalent(t, l, refs[rows], refGrads[rows])
		})
	}
}

// checkEquivalent runs layout l and compares its losses, validation loss,
// first gradients and status records with the single rank's one and
// grads.
func checkEquivalent(t *testing.T, l gridLayout, one Result, grads map[string][]float32) {
	n := l.tp * l.pp * l.dp
	var recs statusRecords
	s := equivSpec(l, t.TempDir())
	res := runRanks(t, s, n, recs.env)
	worst := sameLosses(t, res, one.Losses)
	t.Logf("largest relative loss difference over %d steps: %.2g", len(one.Losses), worst)
	if worst > gridTol {
		t.Errorf("losses %v, single rank %v: relative difference %.2g > %g", res[0].Losses, one.Losses, worst, gridTol)
	}
	gworst := sameGrads(t, firstGrads(t, s.Checkpoint.Dir), grads)
	t.Logf("largest gradient difference after step 1, relative to its tensor's largest: %.2g", gworst)
	for r := range n {
		if d := relDiff(res[r].ValLoss, one.ValLoss); res[r].ValLoss != res[0].ValLoss || l.dp == 1 && d > gridTol {
			t.Errorf("rank %d: validation loss %v, rank 0 %v, single rank %v", r, res[r].ValLoss, res[0].ValLoss, one.ValLoss)
		}
		if l.tp*l.pp == 1 {
			continue // the data-parallel path has no grid coordinates
		}
		c := recs.of(t, r)[0].Coord
		if c == nil || c.TP != r%l.tp || c.PP != r/l.tp%l.pp || c.DP != r/(l.tp*l.pp) {
			t.Errorf("rank %d: status record's coordinates %+v, want TP fastest, then PP, then DP", r, c)
		}
	}
}

// firstGrads reads the whole model's gradient after the first step from
// the step-1 checkpoint under dir, by Hugging Face tensor name. AdamW's
// first moment starts at 0, so after one step it is exactly
// float32((1−β1)·c·g) for every element, where g is the gradient averaged
// over the replicas and c the clip factor of the global norm (1 below
// optim.grad_clip): the checkpoint holds the gradient as the optimizer
// used it, each element saved once by its owner, assembled from whatever
// layout wrote it. Equal moments mean equal clipped gradients and, when
// clipping, an equal global norm: the test model's first norm is above
// optim.grad_clip 1, and a clip factor off by half (grad_clip 0.5 on the
// layout only) fails here while its losses stay within gridTol (3.6e-7
// apart: AdamW's normalisation hides the scale of the gradient).
func firstGrads(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	c, err := ckpt.Open(t.Context(), filepath.Join(dir, ckpt.StepDirName(1)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, ti := range c.Manifest.Tensors {
		name, ok := strings.CutPrefix(ti.Name, zero.ExpAvgPrefix)
		if !ok {
			continue
		}
		if out[name], _, err = c.Tensor(ti.Name); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sameGrads fails unless got holds a gradient of every tensor of want
// (and no other), each within gridGradTol of want's relative to the
// tensor's largest element, and returns the largest such difference.
func sameGrads(t *testing.T, got, want map[string][]float32) float64 {
	t.Helper()
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("first moments of %d tensors, single rank %d: want the same, more than none", len(got), len(want))
	}
	worst := 0.0
	for _, name := range slices.Sorted(maps.Keys(want)) {
		g, w := got[name], want[name]
		if len(g) != len(w) {
			t.Fatalf("%s: %d gradients, single rank %d", name, len(g), len(w))
		}
		d := gradDiff(g, w)
		worst = max(worst, d)
		if d > gridGradTol {
			t.Errorf("%s: gradient after step 1 differs from the single rank's by %.2g of its largest element (> %g)", name, d, gridGradTol)
		}
	}
	return worst
}

// gradDiff is max |g−w| over max |w| (0 for two zero tensors, +Inf when
// only w is zero).
func gradDiff(g, w []float32) float64 {
	var diff, scale float64
	for i := range w {
		diff = max(diff, math.Abs(float64(g[i])-float64(w[i])))
		scale = max(scale, math.Abs(float64(w[i])))
	}
	if diff == 0 {
		return 0
	}
	return diff / scale
}
