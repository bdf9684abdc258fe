package tensorpar

import (
	"math"
	"slices"
	"testing"
)

// ceLogits draws N×V logits of magnitude up to 8, with the last rows'
// upper vocabulary far below the rest (so shards' maxima differ by tens
// and a shard's exponentials are negligible next to another's).
func ceLogits(N, V int, seed uint64) ([]float32, []int32) {
	rnd := newRand(seed)
	z := randSlice(rnd, N*V, 8)
	for n := N - 2; n < N; n++ {
		for v := V / 2; v < V; v++ {
			z[n*V+v] -= 40
		}
	}
	targets := randTokens(rnd, N, V)
	targets[0], targets[1], targets[N-1] = 0, int32(V-1), int32(V-1)
	return z, targets
}

// ceTol returns the tolerances of the losses and of dlogits (dloss = d)
// against the dense kernel. With a = m − z (m the row's maximum), Ā the
// softmax-weighted mean of a in a row, and u = 2⁻²⁴:
//
//   - Each exponential has the kernel's relative error (< 2 ulp = 4u) plus
//     u·a from rounding its argument (the TP version subtracts its shard's
//     maximum, the dense one the row's: different roundings). So S = Σ e^−a
//     is within (4 + Ā)u relative on either side.
//   - The TP version also rounds log S_r to float32 (u·log V absolute), the
//     scaled sums and their reduction over tp ranks ((tp+1)u), and the loss
//     log S − (z_t − m) is rounded once: the losses differ by at most
//     (2(4 + Ā) + log V + tp + 1)u + 2u·|loss|.
//   - A probability e^−a/S carries its exponential's error twice over, S's
//     twice over and four roundings: (2(4 + a) + 2(4 + Ā) + 4)u relative;
//     dlogits is p·d (one more rounding) or (p_t − 1)·d at the target
//     (p_t's error, absolute).
//
// The test allows twice these; a wrong maximum, a missed shard or a
// one-hot on the wrong rank changes the results by orders more.
func ceTol(z, loss, dlog []float32, N, V, tp int, d float32) (lossTol, dTol []float32) {
	lossTol, dTol = make([]float32, N), make([]float32, N*V)
	for n := range N {
		row := z[n*V : (n+1)*V]
		m := slices.Max(row)
		var s, sa float64
		for _, v := range row {
			e := math.Exp(float64(v - m))
			s += e
			sa += e * float64(m-v)
		}
		abar := sa / s
		lossTol[n] = float32(2 * u * (2*(4+abar) + math.Log(float64(V)) + float64(tp) + 1 + 2*math.Abs(float64(loss[n]))))
		for v, zv := range row {
			p := math.Exp(float64(zv-m)) / s
			rel := (2*(4+float64(m-zv)) + 2*(4+abar) + 5) * u
			dTol[n*V+v] = float32(2 * (rel*p*math.Abs(float64(d)) + u*math.Abs(float64(dlog[n*V+v]))))
		}
	}
	return lossTol, dTol
}

// TestCrossEntropyMatchesDense checks the vocab-parallel cross-entropy
// against the dense kernel (losses, and dlogits of the mean loss) for tp 1,
// 2 and 4 on vocabularies that divide by tp and that do not, with probs
// aliasing logits as the model runs it.
func TestCrossEntropyMatchesDense(t *testing.T) {
	const N = 12
	for _, V := range []int{16, 13} {
		for _, tp := range []int{1, 2, 4} {
			t.Run(name(tp, false, "V", V), func(t *testing.T) {
				z, targets := ceLogits(N, V, uint64(V*tp))
				d := float32(1) / N
				loss, probs, dlog := make([]float32, N), make([]float32, N*V), make([]float32, N*V)
				be.CrossEntropy(loss, probs, z, targets, N, V)
				be.CrossEntropyBackward(dlog, probs, targets, d, N, V)
				lossTol, dTol := ceTol(z, loss, dlog, N, V, tp, d)

				shape := []int{N, V}
				buf, losses := make([][]float32, tp), make([][]float32, tp)
				for r := range tp {
					buf[r], losses[r] = part(t, Columns, z, shape, r, tp), make([]float32, N)
				}
				cl := newCluster(t, tp, false)
				cl.run(func(r int, g *Group) error {
					if err := g.CrossEntropy(cl.ctx, losses[r], buf[r], buf[r], targets, N, V); err != nil {
						return err
					}
					return g.CrossEntropyBackward(buf[r], buf[r], targets, d, N, V)
				})
				for r := range tp {
					if !slices.Equal(losses[r], losses[0]) {
						t.Fatalf("rank %d's losses differ from rank 0's: %v vs %v", r, losses[r], losses[0])
					}
					assertWithin(t, name(r, false, "dlogits"), buf[r], part(t, Columns, dlog, shape, r, tp), part(t, Columns, dTol, shape, r, tp))
				}
				assertWithin(t, "losses", losses[0], loss, lossTol)
			})
		}
	}
}

// TestCrossEntropyGradCheck checks the vocab-parallel cross-entropy's
// dlogits against finite differences of L = d·Σ losses on tp 2 and 4 with
// a vocabulary that divides by neither. Step h = 0.05: the truncation error
// h²/6·|L⁽³⁾| is below 5e-5 (L = d·Σ log-sum-exp, whose third derivative
// in one logit is p(1−p)(1−2p)·d < 0.1·d); fdCheck's noise term uses the
// losses' error bound of ceTol.
func TestCrossEntropyGradCheck(t *testing.T) {
	const N, V, h = 6, 7, 0.05
	for _, tp := range []int{2, 4} {
		t.Run(name(tp, false), func(t *testing.T) {
			z, targets := ceLogits(N, V, 3)
			for i := range z {
				z[i] /= 4 // softer probabilities: gradients well above the noise everywhere
			}
			const d = 0.5
			loss, probs := make([]float32, N), make([]float32, N*V)
			be.CrossEntropy(loss, probs, z, targets, N, V)
			lossTol, _ := ceTol(z, loss, probs, N, V, tp, d)

			logits, dlogits, probsR, losses := make([][]float32, tp), make([][]float32, tp), make([][]float32, tp), make([][]float32, tp)
			for r := range tp {
				logits[r] = part(t, Columns, z, []int{N, V}, r, tp)
				dlogits[r], probsR[r], losses[r] = make([]float32, len(logits[r])), make([]float32, len(logits[r])), make([]float32, N)
			}
			cl := newCluster(t, tp, false)
			forward := func(r int, g *Group) error {
				return g.CrossEntropy(cl.ctx, losses[r], probsR[r], logits[r], targets, N, V)
			}
			cl.run(func(r int, g *Group) error {
				if err := forward(r, g); err != nil {
					return err
				}
				return g.CrossEntropyBackward(dlogits[r], probsR[r], targets, d, N, V)
			})
			w, errBound := make([]float64, N), make([]float64, N)
			for n := range N {
				w[n], errBound[n] = d, float64(lossTol[n])+h*u*8 // the bound at x±h: the logits move by h
			}
			eval := func() []float32 {
				cl.run(forward)
				return losses[0]
			}
			fdCheck(t, newRand(9), h, 5e-5, 1e-3, eval, w, errBound,
				fdTarget{name: "logits", vals: logits, grads: dlogits})
		})
	}
}

// TestCrossEntropyErrors checks that bad arguments are errors naming the
// problem, not panics, and that the vocabulary may not be smaller than tp.
func TestCrossEntropyErrors(t *testing.T) {
	g := NewGroup(nil, be, false)
	ctx := t.Context()
	if err := g.CrossEntropy(ctx, make([]float32, 2), make([]float32, 6), make([]float32, 6), []int32{0, 3}, 2, 3); err == nil {
		t.Error("target 3 of a vocabulary of 3: no error")
	}
	if err := g.CrossEntropy(ctx, make([]float32, 2), make([]float32, 6), make([]float32, 5), []int32{0, 1}, 2, 3); err == nil {
		t.Error("5 logits for 2×3: no error")
	}
	if err := g.CrossEntropyBackward(make([]float32, 6), make([]float32, 6), []int32{-1, 0}, 1, 2, 3); err == nil {
		t.Error("target -1: no error")
	}
	cl := newCluster(t, 4, false)
	cl.run(func(r int, g *Group) error {
		if err := g.CrossEntropy(cl.ctx, make([]float32, 1), make([]float32, 1), make([]float32, 1), []int32{0}, 1, 3); err == nil {
			t.Errorf("rank %d: a vocabulary of 3 over tp 4: no error", r)
		}
		return nil
	})
}
