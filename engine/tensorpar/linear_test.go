package tensorpar

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
)

// linCase is a linear layer's dense shape and how it is split.
type linCase struct {
	name       string
	row        bool // row-parallel, else column-parallel
	transposed bool // W stored [Out, In]
	N, In, Out int  // the dense layer
}

// linCases cover both layers, both weight layouts, and split dimensions
// that do not divide by 4 (comm's uneven blocks).
var linCases = []linCase{
	{name: "column", N: 24, In: 16, Out: 22},
	{name: "column-transposed", transposed: true, N: 24, In: 16, Out: 22},
	{name: "row", row: true, N: 24, In: 22, Out: 16},
	{name: "row-transposed", row: true, transposed: true, N: 24, In: 22, Out: 16},
}

// fdLinCases are linCases shrunk for the gradient checks, whose noise
// term grows with the number of outputs.
var fdLinCases = []linCase{
	{name: "column", N: 8, In: 6, Out: 9},
	{name: "column-transposed", transposed: true, N: 8, In: 6, Out: 9},
	{name: "row", row: true, N: 8, In: 9, Out: 6},
	{name: "row-transposed", row: true, transposed: true, N: 8, In: 9, Out: 6},
}

// wShape is the dense weight's shape.
func (c linCase) wShape() []int {
	if c.transposed {
		return []int{c.Out, c.In}
	}
	return []int{c.In, c.Out}
}

// wSplit is how the weight splits: by output features (column) or input
// features (row), which are its rows or columns by layout.
func (c linCase) wSplit() Split {
	if c.row == c.transposed {
		return Columns
	}
	return Rows
}

// denseLinear computes the dense layer with backend.CPU on full tensors:
// Y = X·W + b, dX = dY·Wᵀ, dW = dW0 + Xᵀ·dY, db = db0 + Σ dY. Called on
// absolute values, it gives the bounds of the error analysis.
func denseLinear(c linCase, X, W, b, dY, dW0, db0 []float32) (Y, dX, dW, db []float32) {
	N, In, Out := c.N, c.In, c.Out
	Y, dX = make([]float32, N*Out), make([]float32, N*In)
	dW, db = slices.Clone(dW0), slices.Clone(db0)
	if c.transposed {
		be.Matmul(false, true, N, Out, In, X, In, W, In, 0, Y, Out)
		be.Matmul(false, false, N, In, Out, dY, Out, W, In, 0, dX, In)
		be.Matmul(true, false, Out, In, N, dY, Out, X, In, 1, dW, In)
	} else {
		be.Matmul(false, false, N, Out, In, X, In, W, Out, 0, Y, Out)
		be.Matmul(false, true, N, In, Out, dY, Out, W, Out, 0, dX, In)
		be.Matmul(true, false, In, Out, N, X, In, dY, Out, 1, dW, Out)
	}
	be.AddBias(Y, b, N, Out)
	be.BiasBackward(db, dY, N, Out)
	return Y, dX, dW, db
}

// linRank is one rank's tensors of a linear layer.
type linRank struct {
	l                Linear
	x, w, b, dy      []float32
	dx, dw, db, y    []float32
	wantY, wantDX    []float32 // this rank's part of the dense results
	wantDW, wantDB   []float32
	tolY, tolDX      []float32
	tolDW, tolDB     []float32
	yOwned           bool // y is this rank's own part (not a replica of rank 0's)
	xShared, bShared bool // x / b are whole on every rank
	boundY           []float32
	rY               []float32 // dy as the gradient check's loss weights
}

// linSplit gives rank r its tensors of case c: the parts of the dense
// inputs, the parts of the dense results, and their tolerances.
func linSplit(t *testing.T, c linCase, tp, r int, sp bool, in, out, bound [6][]float32, tolF float64) *linRank {
	t.Helper()
	X, W, b, dY, dW0, db0 := in[0], in[1], in[2], in[3], in[4], in[5]
	ws := c.wShape()
	lr := &linRank{w: part(t, c.wSplit(), W, ws, r, tp), dw: part(t, c.wSplit(), dW0, ws, r, tp)}
	lr.wantDW = part(t, c.wSplit(), out[2], ws, r, tp)
	lr.tolDW = scaled(part(t, c.wSplit(), bound[2], ws, r, tp), tolF)
	if !c.row {
		lo, hi := comm.Block(c.Out, r, tp)
		lr.l = Linear{N: c.N, In: c.In, Out: hi - lo, Transposed: c.transposed}
		lr.x = seqPart(t, X, c.N, c.In, r, tp, sp)
		lr.b, lr.db = part(t, Columns, b, []int{c.Out}, r, tp), part(t, Columns, db0, []int{c.Out}, r, tp)
		lr.dy = part(t, Columns, dY, []int{c.N, c.Out}, r, tp)
		lr.wantY, lr.tolY = part(t, Columns, out[0], []int{c.N, c.Out}, r, tp), scaled(part(t, Columns, bound[0], []int{c.N, c.Out}, r, tp), tolF)
		lr.wantDX, lr.tolDX = seqPart(t, out[1], c.N, c.In, r, tp, sp), scaled(seqPart(t, bound[1], c.N, c.In, r, tp, sp), tolF)
		lr.wantDB, lr.tolDB = part(t, Columns, out[3], []int{c.Out}, r, tp), scaled(part(t, Columns, bound[3], []int{c.Out}, r, tp), tolF)
		lr.yOwned, lr.xShared = true, !sp
		lr.boundY = part(t, Columns, bound[0], []int{c.N, c.Out}, r, tp)
	} else {
		lo, hi := comm.Block(c.In, r, tp)
		lr.l = Linear{N: c.N, In: hi - lo, Out: c.Out, Transposed: c.transposed}
		lr.x = part(t, Columns, X, []int{c.N, c.In}, r, tp)
		lr.b, lr.db = slices.Clone(b), slices.Clone(db0)
		lr.dy = seqPart(t, dY, c.N, c.Out, r, tp, sp)
		lr.wantY, lr.tolY = seqPart(t, out[0], c.N, c.Out, r, tp, sp), scaled(seqPart(t, bound[0], c.N, c.Out, r, tp, sp), tolF)
		lr.wantDX, lr.tolDX = part(t, Columns, out[1], []int{c.N, c.In}, r, tp), scaled(part(t, Columns, bound[1], []int{c.N, c.In}, r, tp), tolF)
		lr.wantDB, lr.tolDB = slices.Clone(out[3]), scaled(bound[3], tolF)
		lr.yOwned, lr.bShared = sp || r == 0, true
		lr.boundY = seqPart(t, bound[0], c.N, c.Out, r, tp, sp)
	}
	lr.y, lr.dx = make([]float32, len(lr.wantY)), make([]float32, len(lr.x))
	lr.rY = lr.dy
	return lr
}

// forward runs the rank's layer forward.
func (lr *linRank) forward(c linCase, cl *cluster, g *Group) error {
	if c.row {
		return g.RowForward(cl.ctx, lr.l, lr.y, lr.x, lr.w, lr.b)
	}
	return g.ColumnForward(cl.ctx, lr.l, lr.y, lr.x, lr.w, lr.b)
}

// backward runs the rank's layer backward.
func (lr *linRank) backward(c linCase, cl *cluster, g *Group) error {
	if c.row {
		return g.RowBackward(cl.ctx, lr.l, lr.dx, lr.dw, lr.db, lr.dy, lr.x, lr.w)
	}
	return g.ColumnBackward(cl.ctx, lr.l, lr.dx, lr.dw, lr.db, lr.dy, lr.x, lr.w)
}

// linInputs draws a case's dense inputs: X, W, b, dY, and the gradients
// dW0, db0 that the backward accumulates onto.
func linInputs(rnd *rand.Rand, c linCase) [6][]float32 {
	return [6][]float32{
		randSlice(rnd, c.N*c.In, 1), randSlice(rnd, c.In*c.Out, 1), randSlice(rnd, c.Out, 1),
		randSlice(rnd, c.N*c.Out, 1), randSlice(rnd, c.In*c.Out, 1), randSlice(rnd, c.Out, 1),
	}
}

// linAbs is the inputs' absolute values plus pad.
func linAbs(in [6][]float32, pad float32) [6][]float32 {
	var a [6][]float32
	for i, s := range in {
		a[i] = abs(s, pad)
	}
	return a
}

// linTolFactor is the tolerance per unit of bound. Every result is a sum
// of at most K = max(N, In, Out) products (plus a bias or an accumulated
// gradient), and a float32 sum of K terms in any order, fused or not, is
// within γ = K·u/(1−K·u) of Σ|terms| of the exact value. The TP version
// adds at most tp−1 roundings (the reduction of the partial sums) and is
// otherwise the same kind of sum, so both results lie within
// γ_{K+tp+1}·bound of the exact value, and within twice that of each
// other, bound being the same computation on absolute values (|X|·|W| +
// |b|, …). One more K·u covers the rounding of the bound itself. This
// is rigorous, so the test cannot fail by bad luck; a wrong slice, a
// missing reduction or a double-counted bias is off by the order of the
// values themselves, thousands of times more.
func linTolFactor(c linCase, tp int) float64 {
	K := float64(max(c.N, c.In, c.Out) + tp + 2)
	return 3 * K * u
}

// TestLinearMatchesDense checks that each TP layer's output and its input,
// weight and bias gradients are the dense layer's, split as the layer's
// rank holds them, for tp 1, 2 and 4 with and without sequence
// parallelism.
func TestLinearMatchesDense(t *testing.T) {
	for _, c := range linCases {
		for _, tp := range []int{1, 2, 4} {
			for _, sp := range []bool{false, true} {
				t.Run(name(tp, sp, c.name), func(t *testing.T) {
					rnd := newRand(uint64(7*tp + len(c.name)))
					in := linInputs(rnd, c)
					var out, bound [6][]float32
					out[0], out[1], out[2], out[3] = denseLinear(c, in[0], in[1], in[2], in[3], in[4], in[5])
					a := linAbs(in, 0)
					bound[0], bound[1], bound[2], bound[3] = denseLinear(c, a[0], a[1], a[2], a[3], a[4], a[5])
					cl := newCluster(t, tp, sp)
					ranks := make([]*linRank, tp)
					for r := range tp {
						ranks[r] = linSplit(t, c, tp, r, sp, in, out, bound, linTolFactor(c, tp))
					}
					cl.run(func(r int, g *Group) error {
						if err := ranks[r].forward(c, cl, g); err != nil {
							return err
						}
						return ranks[r].backward(c, cl, g)
					})
					for r, lr := range ranks {
						pre := name(r, false)
						assertWithin(t, pre+" y", lr.y, lr.wantY, lr.tolY)
						assertWithin(t, pre+" dx", lr.dx, lr.wantDX, lr.tolDX)
						assertWithin(t, pre+" dw", lr.dw, lr.wantDW, lr.tolDW)
						assertWithin(t, pre+" db", lr.db, lr.wantDB, lr.tolDB)
					}
				})
			}
		}
	}
}

// TestLinearGradCheck checks each layer's analytic gradients against
// finite differences of L = Σ y·R over the group's output, on tp 2 with
// and without sequence parallelism (tp 1 is the dense layer). The layers
// are linear in every input, so the central difference has no truncation
// error and a large step keeps the rounding noise small: the tolerance is
// fdCheck's noise term with the error bounds of linTolFactor (about 1e-3
// here), plus 1e-4 for the analytic gradient's own rounding (at most
// γ_{N+2}·Σ|x|·|R| ≈ 6e-6 here) and 1e-3 relative.
func TestLinearGradCheck(t *testing.T) {
	const h = 0.25
	for _, c := range fdLinCases {
		for _, sp := range []bool{false, true} {
			const tp = 2
			t.Run(name(tp, sp, c.name), func(t *testing.T) {
				rnd := newRand(uint64(31 + len(c.name)))
				in := linInputs(rnd, c)
				clear(in[4])
				clear(in[5])
				var out, bound [6][]float32
				out[0], out[1], out[2], out[3] = denseLinear(c, in[0], in[1], in[2], in[3], in[4], in[5])
				a := linAbs(in, h)
				bound[0], bound[1], bound[2], bound[3] = denseLinear(c, a[0], a[1], a[2], a[3], a[4], a[5])
				cl := newCluster(t, tp, sp)
				ranks := make([]*linRank, tp)
				for r := range tp {
					ranks[r] = linSplit(t, c, tp, r, sp, in, out, bound, linTolFactor(c, tp))
				}
				cl.run(func(r int, g *Group) error { return ranks[r].backward(c, cl, g) })
				var w, errBound []float64
				for _, lr := range ranks {
					if lr.yOwned {
						for i := range lr.rY {
							w = append(w, float64(lr.rY[i]))
							errBound = append(errBound, float64(lr.boundY[i])*linTolFactor(c, tp)/2)
						}
					}
				}
				eval := func() []float32 {
					cl.run(func(r int, g *Group) error { return ranks[r].forward(c, cl, g) })
					var y []float32
					for _, lr := range ranks {
						if lr.yOwned {
							y = append(y, lr.y...)
						}
					}
					return y
				}
				collect := func(f func(*linRank) (v, g []float32)) (vals, grads [][]float32) {
					for _, lr := range ranks {
						v, g := f(lr)
						vals, grads = append(vals, v), append(grads, g)
					}
					return vals, grads
				}
				xv, xg := collect(func(lr *linRank) ([]float32, []float32) { return lr.x, lr.dx })
				wv, wg := collect(func(lr *linRank) ([]float32, []float32) { return lr.w, lr.dw })
				bv, bg := collect(func(lr *linRank) ([]float32, []float32) { return lr.b, lr.db })
				fdCheck(t, rnd, h, 1e-4, 1e-3, eval, w, errBound,
					fdTarget{name: "x", vals: xv, grads: xg, replicated: ranks[0].xShared},
					fdTarget{name: "w", vals: wv, grads: wg},
					fdTarget{name: "b", vals: bv, grads: bg, replicated: ranks[0].bShared})
			})
		}
	}
}

// TestLayerArgumentErrors checks that wrong sizes and a token count that
// sequence parallelism cannot split are errors naming the problem, not
// panics, and that every rank of a group refuses alike (before any
// collective, so none waits for the others).
func TestLayerArgumentErrors(t *testing.T) {
	g := NewGroup(nil, be, false)
	ctx := t.Context()
	l := Linear{N: 2, In: 3, Out: 4}
	f := func(n int) []float32 { return make([]float32, n) }
	for _, c := range []struct {
		name string
		err  error
	}{
		{"column forward, short x", g.ColumnForward(ctx, l, f(8), f(5), f(12), nil)},
		{"column forward, long bias", g.ColumnForward(ctx, l, f(8), f(6), f(12), f(5))},
		{"column backward, short dw", g.ColumnBackward(ctx, l, f(6), f(11), nil, f(8), f(6), f(12))},
		{"row forward, short y", g.RowForward(ctx, l, f(7), f(6), f(12), nil)},
		{"row backward, short dx", g.RowBackward(ctx, l, f(5), f(12), nil, f(8), f(6), f(12))},
		{"zero width", g.ColumnForward(ctx, Linear{N: 2, In: 0, Out: 4}, f(8), nil, nil, nil)},
		{"embedding, token outside", g.EmbeddingForward(ctx, Embedding{B: 1, T: 2, C: 2, V: 3}, f(4), []int32{0, 3}, f(6), nil)},
		{"embedding, short wpe", g.EmbeddingForward(ctx, Embedding{B: 1, T: 2, C: 2, V: 3}, f(4), []int32{0, 2}, f(6), f(3))},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		} else if !strings.HasPrefix(c.err.Error(), "tensorpar: ") {
			t.Errorf("%s: error %q does not name the package", c.name, c.err)
		}
	}
	cl := newCluster(t, 2, true)
	cl.run(func(r int, g *Group) error {
		err := g.ColumnForward(cl.ctx, Linear{N: 5, In: 2, Out: 2}, f(10), f(4), f(4), nil)
		if err == nil || !strings.Contains(err.Error(), "do not divide by tp 2") {
			t.Errorf("rank %d: 5 tokens over tp 2 with sequence parallelism: error %v", r, err)
		}
		return nil
	})
}
