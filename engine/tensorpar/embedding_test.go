package tensorpar

import (
	"math"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
)

// embRank is one rank's tensors of a vocab-parallel embedding.
type embRank struct {
	wte, wpe, out, dout, dwte, dwpe []float32
}

// embSplit gives every rank its part of the dense tensors.
func embSplit(t *testing.T, e Embedding, tp int, sp bool, wte, wpe, dout, dwte0, dwpe0 []float32) []*embRank {
	t.Helper()
	N := e.B * e.T
	ranks := make([]*embRank, tp)
	for r := range tp {
		ranks[r] = &embRank{
			wte:  part(t, Rows, wte, []int{e.V, e.C}, r, tp),
			dwte: part(t, Rows, dwte0, []int{e.V, e.C}, r, tp),
			wpe:  slices.Clone(wpe), dwpe: slices.Clone(dwpe0),
			dout: seqPart(t, dout, N, e.C, r, tp, sp),
		}
		ranks[r].out = make([]float32, len(ranks[r].dout))
	}
	return ranks
}

// TestEmbeddingMatchesDense checks the vocab-parallel embedding against the
// dense encoder kernel, forward and backward, for tp 1, 2 and 4 with and
// without sequence parallelism, on a vocabulary that does not divide by 2
// or 4. The tolerance is zero: every output is one table row plus one
// position row (the reduction adds only zeros, which is exact), and every
// gradient row accumulates the same values in the same order as the
// kernel, so the results are the dense ones exactly.
func TestEmbeddingMatchesDense(t *testing.T) {
	e := Embedding{B: 2, T: 6, C: 5, V: 13}
	N := e.B * e.T
	for _, tp := range []int{1, 2, 4} {
		for _, sp := range []bool{false, true} {
			t.Run(name(tp, sp), func(t *testing.T) {
				rnd := newRand(uint64(11 + tp))
				tokens := randTokens(rnd, N, e.V)
				tokens[0], tokens[1] = 0, int32(e.V-1) // both ends of the vocabulary
				wte, wpe := randSlice(rnd, e.V*e.C, 1), randSlice(rnd, (e.T+2)*e.C, 1)
				dout, dwte0, dwpe0 := randSlice(rnd, N*e.C, 1), randSlice(rnd, e.V*e.C, 1), randSlice(rnd, (e.T+2)*e.C, 1)
				out := make([]float32, N*e.C)
				be.Encoder(out, tokens, wte, wpe, e.B, e.T, e.C)
				dwte, dwpe := slices.Clone(dwte0), slices.Clone(dwpe0)
				be.EncoderBackward(dwte, dwpe, dout, tokens, e.B, e.T, e.C)

				ranks := embSplit(t, e, tp, sp, wte, wpe, dout, dwte0, dwpe0)
				cl := newCluster(t, tp, sp)
				cl.run(func(r int, g *Group) error {
					k := ranks[r]
					if err := g.EmbeddingForward(cl.ctx, e, k.out, tokens, k.wte, k.wpe); err != nil {
						return err
					}
					return g.EmbeddingBackward(cl.ctx, e, k.dwte, k.dwpe, k.dout, tokens)
				})
				for r, k := range ranks {
					if want := seqPart(t, out, N, e.C, r, tp, sp); !slices.Equal(k.out, want) {
						t.Errorf("rank %d: out = %v, want %v", r, k.out, want)
					}
					if want := part(t, Rows, dwte, []int{e.V, e.C}, r, tp); !slices.Equal(k.dwte, want) {
						t.Errorf("rank %d: dwte = %v, want %v", r, k.dwte, want)
					}
					if !slices.Equal(k.dwpe, dwpe) {
						t.Errorf("rank %d: dwpe = %v, want %v", r, k.dwpe, dwpe)
					}
				}
			})
		}
	}
}

// TestEmbeddingGradCheck checks the embedding's gradients against finite
// differences of L = Σ out·R on tp 2, with and without sequence
// parallelism. The output is linear in both tables; each output is the
// rounded sum of two terms, within u·(|wte|+|wpe|+2h) of the exact value,
// which is fdCheck's error bound; 1e-5 covers the analytic gradient's
// rounding (a sum of at most B·T terms of magnitude 1: γ_12·12 ≈ 1e-5).
func TestEmbeddingGradCheck(t *testing.T) {
	const h, tp = 0.25, 2
	e := Embedding{B: 2, T: 4, C: 3, V: 7}
	N := e.B * e.T
	for _, sp := range []bool{false, true} {
		t.Run(name(tp, sp), func(t *testing.T) {
			rnd := newRand(5)
			tokens := randTokens(rnd, N, e.V)
			tokens[0], tokens[1] = 0, int32(e.V-1) // a token on each rank
			wte, wpe := randSlice(rnd, e.V*e.C, 1), randSlice(rnd, e.T*e.C, 1)
			dout := randSlice(rnd, N*e.C, 1)
			ranks := embSplit(t, e, tp, sp, wte, wpe, dout, make([]float32, e.V*e.C), make([]float32, e.T*e.C))
			cl := newCluster(t, tp, sp)
			cl.run(func(r int, g *Group) error {
				k := ranks[r]
				return g.EmbeddingBackward(cl.ctx, e, k.dwte, k.dwpe, k.dout, tokens)
			})
			var w, errBound []float64
			for r, k := range ranks {
				if !sp && r > 0 {
					continue // a replica of rank 0's output
				}
				lo := 0
				if sp {
					lo, _ = comm.Block(N, r, tp)
				}
				for i, d := range k.dout {
					n, c := lo+i/e.C, i%e.C
					w = append(w, float64(d))
					wt, wp := wte[int(tokens[n])*e.C+c], wpe[n%e.T*e.C+c]
					errBound = append(errBound, u*(math.Abs(float64(wt))+math.Abs(float64(wp))+2*h))
				}
			}
			eval := func() []float32 {
				cl.run(func(r int, g *Group) error {
					k := ranks[r]
					return g.EmbeddingForward(cl.ctx, e, k.out, tokens, k.wte, k.wpe)
				})
				var out []float32
				for r, k := range ranks {
					if sp || r == 0 {
						out = append(out, k.out...)
					}
				}
				return out
			}
			var wv, wg, pv, pg [][]float32
			for _, k := range ranks {
				wv, wg = append(wv, k.wte), append(wg, k.dwte)
				pv, pg = append(pv, k.wpe), append(pg, k.dwpe)
			}
			fdCheck(t, rnd, h, 1e-5, 1e-3, eval, w, errBound,
				fdTarget{name: "wte", vals: wv, grads: wg},
				fdTarget{name: "wpe", vals: pv, grads: pg, replicated: true})
		})
	}
}
