package train

import (
	"os"
	"path/filepath"
	"testing"
)

// gridPrecisionLayouts are the layouts bf16 and fp16 are checked on: both
// kinds of model parallelism with one replica, and each with two (the
// gradients averaged over DP in the working type).
var gridPrecisionLayouts = []gridLayout{
	{tp: 2, pp: 2, dp: 1}, {tp: 2, pp: 1, dp: 2}, {tp: 1, pp: 2, dp: 2},
}

// TestGridMixedPrecisionTracksFP32: on tp2·pp2, tp2·dp2 and pp2·dp2, at
// ZeRO 0 and 1, bf16 and fp16 runs (parameters rounded to the type,
// gradients averaged over DP in it) stay within lowPrecisionBand of the
// same layout's fp32 loss at each of 8 steps, as the data-parallel path's
// do, without skipped steps; they differ from fp32 (the rounding is in
// effect), every rank reports the same loss, and the memory of the status
// records counts the fp32 masters (optimizer state 12 B instead of 8 B
// per owned element; parameters and gradients 4 B in every precision).
// fp16 starts at a loss scale of 2^12: at the default 2^16 a replica's
// gradient on half the batch overflows fp16 at step 2 of this model, and
// the data-parallel path skips that step too.
func TestGridMixedPrecisionTracksFP32(t *testing.T) {
	for _, base := range gridPrecisionLayouts {
		for z := range 2 {
			l := base
			l.zero = z
			t.Run(l.String(), func(t *testing.T) {
				n := l.tp * l.pp * l.dp
				s := gridSpec(l)
				s.Steps, s.Eval = 8, EvalSpec{}
				var ref statusRecords
				fp32 := runRanks(t, s, n, ref.env)[0].Losses
				s.LossScale.InitialScale = 1 << 12
				for _, prec := range []string{"bf16", "fp16"} {
					s.Precision = prec
					var recs statusRecords
					res := runRanks(t, s, n, recs.env)
					worst := sameLosses(t, res, fp32)
					t.Logf("%s: largest relative loss difference to fp32: %.2g", prec, worst)
					if worst > lowPrecisionBand || worst == 0 || res[0].Skipped > 0 {
						t.Errorf("%s: losses %v, fp32 %v: difference %.2g, want within (0, %g]; %d skipped steps", prec, res[0].Losses, fp32, worst, lowPrecisionBand, res[0].Skipped)
					}
					checkMixedMemory(t, prec, n, &recs, &ref)
				}
			})
		}
	}
}

// checkMixedMemory: each rank's mixed-precision status record reports the
// fp32 run's parameters and gradients, and half as much again optimizer
// state (the masters beside the two moments).
func checkMixedMemory(t *testing.T, prec string, n int, recs, ref *statusRecords) {
	t.Helper()
	for r := range n {
		got, want := recs.of(t, r)[0].Memory, ref.of(t, r)[0].Memory
		if got.Params != want.Params || got.Grads != want.Grads || 2*got.Optimizer != 3*want.Optimizer || want.Optimizer == 0 {
			t.Errorf("%s rank %d: memory %+v, fp32 %+v: want the same parameters and gradients, 1.5 times the optimizer state", prec, r, got, want)
		}
	}
}

// TestGridFP16OverflowSkipsAndRecovers: fp16 on tp2·dp2 and tp2·pp2
// starting at a loss scale of 2^20, at which the gradients overflow fp16:
// every rank skips the same first steps, each halving the scale (the
// status records of every rank carry it), until it fits; then training
// goes on and the loss falls.
func TestGridFP16OverflowSkipsAndRecovers(t *testing.T) {
	for _, l := range []gridLayout{{tp: 2, pp: 1, dp: 2, zero: 1}, {tp: 2, pp: 2, dp: 1}} {
		t.Run(l.String(), func(t *testing.T) {
			n := l.tp * l.pp * l.dp
			s := gridSpec(l)
			s.Steps, s.Eval, s.Precision = 12, EvalSpec{}, "fp16"
			s.LossScale.InitialScale = 1 << 20
			var recs statusRecords
			res := runRanks(t, s, n, recs.env)
			rs := recs.of(t, 0)
			for r := 1; r < n; r++ {
				if !sameSkips(recs.of(t, r), rs) {
					t.Fatalf("rank %d skipped other steps or has another loss scale than rank 0", r)
				}
			}
			skipped := 0
			for i, r := range rs {
				if !r.Skipped {
					continue
				}
				skipped++
				if i > 0 && r.LossScale != rs[i-1].LossScale/2 {
					t.Errorf("step %d skipped: loss scale %g, want half of %g", r.Step, r.LossScale, rs[i-1].LossScale)
				}
			}
			if !rs[0].Skipped || rs[0].LossScale != 1<<19 || skipped != res[0].Skipped || skipped > len(rs)/2 {
				t.Fatalf("first step skipped %v at scale %g, %d skipped (result says %d) of %d records: want the first steps skipped, then recovery", rs[0].Skipped, rs[0].LossScale, skipped, res[0].Skipped, len(rs))
			}
			last := rs[len(rs)-1]
			if first := rs[skipped]; last.Skipped || first.Skipped || !(last.Loss < first.Loss) {
				t.Errorf("after %d skipped steps the loss went %v → %v: no recovery", skipped, first.Loss, last.Loss)
			}
			t.Logf("%d steps skipped; scale now %g; loss %v → %v", skipped, last.LossScale, rs[0].Loss, last.Loss)
		})
	}
}

// sameSkips reports whether two ranks' records skipped the same steps at
// the same loss scales.
func sameSkips(a, b []Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Skipped != b[i].Skipped || a[i].LossScale != b[i].LossScale || a[i].Step != b[i].Step {
			return false
		}
	}
	return true
}

// mixedReshardTol bounds the relative loss difference between a bf16 run
// resumed on another layout and the uninterrupted one. With bf16 compute
// every multiply rounds its operands to bf16 (8 bits of mantissa), so the
// float32 differences of another layout's summation order (gridTol's
// kind, 1e-7 relative) flip the rounding of an operand now and then, each
// flip moving a product by up to 2^-8 of itself: the losses drift apart
// by far more than in fp32, though far less than lowPrecisionBand (2e-3,
// bf16 against fp32). Gradients are averaged in fp32 here: in bf16 the
// data-parallel path accumulates the micro-batches in bf16 while the grid
// path rounds their fp32 sum once, a difference of lowPrecisionBand's
// kind. Measured with bf16 matmuls: at most 1.8e-6 over the four steps
// after the checkpoint; the bound leaves a factor of 50, still 40 times
// tighter than lowPrecisionBand, so a resume that lost the masters or the
// moments (a jump of 1e-3 and more) fails it.
const mixedReshardTol = 1e-4

// TestGridMixedPrecisionCheckpointReshards: a bf16 tp2·pp2 run
// checkpointed at step 4 of 8 resumes on the same layout with exactly the
// uninterrupted losses (the fp32 masters, moments and sampler restored,
// not the rounded parameters), and on one rank (the data-parallel path)
// within mixedReshardTol; a bf16 one-rank checkpoint resumes on tp2·pp2
// as well. An fp16 tp2·pp2 run whose first steps overflowed resumes with
// its loss scale and skip count, exactly, the loss scale in the status
// records of the resumed run continuing the uninterrupted run's.
func TestGridMixedPrecisionCheckpointReshards(t *testing.T) {
	spec := func(l gridLayout, prec, dir string) Spec {
		s := gridSpec(l)
		s.Steps, s.Eval, s.Checkpoint = 8, EvalSpec{}, CkptSpec{Dir: dir, Every: 4}
		s.Precision = prec
		s.Optim.WarmupSteps = 2
		if prec == "fp16" {
			// The first steps overflow (gradients in fp16), so the
			// checkpoint's scale is not the initial one.
			s.LossScale.InitialScale = 1 << 20
		} else {
			s.Parallel.GradDType = "fp32"
		}
		return s
	}
	grid, one := gridLayout{tp: 2, pp: 2, dp: 1, zero: 1}, gridLayout{tp: 1, pp: 1, dp: 1}
	for _, c := range []struct {
		name     string
		prec     string
		from, to gridLayout
		tol      float64
	}{
		{"bf16/tp2pp2-to-tp2pp2", "bf16", grid, grid, 0},
		{"bf16/tp2pp2-to-one-rank", "bf16", grid, one, mixedReshardTol},
		{"bf16/one-rank-to-tp2pp2", "bf16", one, grid, mixedReshardTol},
		{"fp16/tp2pp2-to-tp2pp2", "fp16", grid, grid, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			from, to := c.from.tp*c.from.pp, c.to.tp*c.to.pp
			var full statusRecords
			runRanks(t, spec(c.from, c.prec, t.TempDir()), from, full.env)
			dir := t.TempDir()
			runRanks(t, spec(c.from, c.prec, dir), from, func(e *Env) { e.StopAfter = 4 })
			work := filepath.Join(t.TempDir(), "run")
			if err := os.CopyFS(work, os.DirFS(dir)); err != nil {
				t.Fatal(err)
			}
			var resumed statusRecords
			res := runRanks(t, spec(c.to, c.prec, work), to, func(e *Env) { e.Resume = true; resumed.env(e) })
			want := full.of(t, 0)
			got := resumed.of(t, 0)
			k := len(want) - len(got)
			if res[0].Resumed != 4 || k != 4 {
				t.Fatalf("resumed from step %d with %d records, uninterrupted %d: want step 4", res[0].Resumed, len(got), len(want))
			}
			skips := 0
			for _, r := range want[:k] {
				if r.Skipped {
					skips++
				}
			}
			if c.prec == "fp16" && (skips == 0 || res[0].Skipped != skips) {
				t.Errorf("fp16: %d steps skipped before the checkpoint, the resumed run counts %d: want some, the same", skips, res[0].Skipped)
			}
			worst := 0.0
			for i, r := range got {
				w := want[k+i]
				worst = max(worst, relDiff(r.Loss, w.Loss))
				if r.Step != w.Step || r.LossScale != w.LossScale || r.Skipped != w.Skipped {
					t.Errorf("step %d: loss scale %g, skipped %v; uninterrupted step %d %g, %v", r.Step, r.LossScale, r.Skipped, w.Step, w.LossScale, w.Skipped)
				}
			}
			t.Logf("largest relative loss difference to the uninterrupted run: %.2g", worst)
			if worst > c.tol {
				t.Errorf("losses after resume differ from the uninterrupted run's by %.2g > %g", worst, c.tol)
			}
		})
	}
}
