package tensorpar

import (
	"math"
	"slices"
	"testing"
)

// The layers composed as a transformer block composes them: attention
// split by heads (c_attn column-parallel with the QKVHeads split, the
// attention kernel on each rank's heads, c_proj row-parallel), and the MLP
// behind a LayerNorm on sequence shards (c_fc column-parallel, GELU,
// c_proj row-parallel). Compared with the dense block on backend.CPU.
//
// Tolerance: |got − want| ≤ blockTol·max|want| over each tensor. Each
// stage is within a few γ_K of its inputs' scale (K ≤ 4C = 48 here, γ ≈
// 3e-6) and the stages' condition numbers are small at these input scales
// (softmax of scores below 1, LayerNorm of unit-variance rows), so the
// composition is within a few times 1e-5 of the tensor's scale; a head or
// feature taken from the wrong place is off by the scale itself.
const blockTol = 1e-4

// assertScaled fails unless |got[i] − want[i]| ≤ blockTol·max|want|.
func assertScaled(t *testing.T, name string, got, want []float32) {
	t.Helper()
	var m float64
	for _, v := range want {
		m = max(m, math.Abs(float64(v)))
	}
	if m == 0 {
		t.Fatalf("%s: the reference is all zero; the comparison would prove nothing", name)
	}
	tol := make([]float32, len(want))
	for i := range tol {
		tol[i] = float32(blockTol * m)
	}
	assertWithin(t, name, got, want, tol)
}

// TestAttentionBlockSplitByHeads checks x → c_attn → attention → c_proj,
// forward and backward, on tp 1, 2 and 4 (4 heads) with and without
// sequence parallelism against the dense block. It fails if c_attn's
// columns are split into contiguous thirds rather than by heads.
func TestAttentionBlockSplitByHeads(t *testing.T) {
	const B, T, C, NH = 2, 6, 16, 4
	N := B * T
	rnd := newRand(21)
	x, dy := randSlice(rnd, N*C, 1), randSlice(rnd, N*C, 1)
	wa, ba := randSlice(rnd, C*3*C, 0.3), randSlice(rnd, 3*C, 0.3)
	wp, bp := randSlice(rnd, C*C, 0.3), randSlice(rnd, C, 0.3)

	// The dense block.
	attn := linCase{N: N, In: C, Out: 3 * C}
	proj := linCase{row: true, N: N, In: C, Out: C}
	qkv, _, _, _ := denseLinear(attn, x, wa, ba, make([]float32, N*3*C), make([]float32, C*3*C), make([]float32, 3*C))
	atty, att := make([]float32, N*C), make([]float32, B*NH*T*T)
	be.Attention(atty, att, qkv, B, T, C, NH)
	y, datty, dwp, dbp := denseLinear(proj, atty, wp, bp, dy, make([]float32, C*C), make([]float32, C))
	dqkv := make([]float32, N*3*C)
	be.AttentionBackward(dqkv, datty, qkv, att, make([]float32, be.AttentionScratch(T)), B, T, C, NH)
	_, dx, dwa, dba := denseLinear(attn, x, wa, ba, dqkv, make([]float32, C*3*C), make([]float32, 3*C))

	for _, tp := range []int{1, 2, 4} {
		for _, sp := range []bool{false, true} {
			t.Run(name(tp, sp), func(t *testing.T) {
				cw, nh := C/tp, NH/tp
				qkvPart := func(full []float32, shape []int, r int) []float32 {
					p, err := Part{Split: QKVHeads, Rank: r, Size: tp, Heads: NH}.Extract(full, shape)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				type rank struct{ x, wa, ba, wp, y, dy, dx, dwa, dba, dwp, dbp []float32 }
				ranks := make([]*rank, tp)
				for r := range tp {
					ranks[r] = &rank{
						x: seqPart(t, x, N, C, r, tp, sp), dy: seqPart(t, dy, N, C, r, tp, sp),
						wa: qkvPart(wa, []int{C, 3 * C}, r), ba: qkvPart(ba, []int{3 * C}, r),
						wp: part(t, Rows, wp, []int{C, C}, r, tp), dwa: make([]float32, C*3*cw),
						dba: make([]float32, 3*cw), dwp: make([]float32, cw*C), dbp: make([]float32, C),
					}
					ranks[r].y, ranks[r].dx = make([]float32, len(ranks[r].x)), make([]float32, len(ranks[r].x))
				}
				cl := newCluster(t, tp, sp)
				cl.run(func(r int, g *Group) error {
					k := ranks[r]
					la, lp := Linear{N: N, In: C, Out: 3 * cw}, Linear{N: N, In: cw, Out: C}
					qkv, atty, att := make([]float32, N*3*cw), make([]float32, N*cw), make([]float32, B*nh*T*T)
					if err := g.ColumnForward(cl.ctx, la, qkv, k.x, k.wa, k.ba); err != nil {
						return err
					}
					be.Attention(atty, att, qkv, B, T, cw, nh)
					if err := g.RowForward(cl.ctx, lp, k.y, atty, k.wp, bp); err != nil {
						return err
					}
					datty, dqkv := make([]float32, N*cw), make([]float32, N*3*cw)
					if err := g.RowBackward(cl.ctx, lp, datty, k.dwp, k.dbp, k.dy, atty, k.wp); err != nil {
						return err
					}
					be.AttentionBackward(dqkv, datty, qkv, att, make([]float32, be.AttentionScratch(T)), B, T, cw, nh)
					return g.ColumnBackward(cl.ctx, la, k.dx, k.dwa, k.dba, dqkv, k.x, k.wa)
				})
				for r, k := range ranks {
					pre := name(r, false)
					assertScaled(t, pre+" y", k.y, seqPart(t, y, N, C, r, tp, sp))
					assertScaled(t, pre+" dx", k.dx, seqPart(t, dx, N, C, r, tp, sp))
					assertScaled(t, pre+" dc_attn.weight", k.dwa, qkvPart(dwa, []int{C, 3 * C}, r))
					assertScaled(t, pre+" dc_attn.bias", k.dba, qkvPart(dba, []int{3 * C}, r))
					assertScaled(t, pre+" dc_proj.weight", k.dwp, part(t, Rows, dwp, []int{C, C}, r, tp))
					assertScaled(t, pre+" dc_proj.bias", k.dbp, dbp)
				}
			})
		}
	}
}

// TestMLPBlockSequenceParallel checks out = x + c_proj(GELU(c_fc(LN(x)))),
// forward and backward, on tp 1, 2 and 4 with and without sequence
// parallelism: the residual and LayerNorm run on each rank's rows, and
// ReduceReplicated completes the LayerNorm's gradients, which must then be
// the same on every rank. The hidden width 4C = 36 is uneven over 4.
func TestMLPBlockSequenceParallel(t *testing.T) {
	const B, T, C = 2, 4, 9
	N, H := B*T, 4*C
	rnd := newRand(22)
	x, dout := randSlice(rnd, N*C, 1), randSlice(rnd, N*C, 1)
	lw, lb := randSlice(rnd, C, 1), randSlice(rnd, C, 0.3)
	wf, bf := randSlice(rnd, C*H, 0.3), randSlice(rnd, H, 0.3)
	wp, bp := randSlice(rnd, H*C, 0.3), randSlice(rnd, C, 0.3)

	// The dense block.
	ln, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
	be.LayerNorm(ln, mean, rstd, x, lw, lb, N, C)
	fc := linCase{N: N, In: C, Out: H}
	proj := linCase{row: true, N: N, In: H, Out: C}
	h, _, _, _ := denseLinear(fc, ln, wf, bf, make([]float32, N*H), make([]float32, C*H), make([]float32, H))
	hg := make([]float32, N*H)
	be.Gelu(hg, h)
	y, dhg, dwp, dbp := denseLinear(proj, hg, wp, bp, dout, make([]float32, H*C), make([]float32, C))
	out := make([]float32, N*C)
	be.Residual(out, x, y)
	dh := make([]float32, N*H)
	be.GeluBackward(dh, h, dhg)
	_, dln, dwf, dbf := denseLinear(fc, ln, wf, bf, dh, make([]float32, C*H), make([]float32, H))
	dx, dlw, dlb := slices.Clone(dout), make([]float32, C), make([]float32, C)
	be.LayerNormBackward(dx, dlw, dlb, dln, x, lw, mean, rstd, N, C)

	for _, tp := range []int{1, 2, 4} {
		for _, sp := range []bool{false, true} {
			t.Run(name(tp, sp), func(t *testing.T) {
				type rank struct{ x, dout, wf, bf, wp, out, dx, dlw, dlb, dwf, dbf, dwp, dbp []float32 }
				ranks := make([]*rank, tp)
				for r := range tp {
					k := &rank{
						x: seqPart(t, x, N, C, r, tp, sp), dout: seqPart(t, dout, N, C, r, tp, sp),
						wf: part(t, Columns, wf, []int{C, H}, r, tp), bf: part(t, Columns, bf, []int{H}, r, tp),
						wp: part(t, Rows, wp, []int{H, C}, r, tp), dlw: make([]float32, C), dlb: make([]float32, C), dbp: make([]float32, C),
					}
					k.out, k.dx, k.dwf, k.dbf, k.dwp = make([]float32, len(k.x)), make([]float32, len(k.x)), make([]float32, len(k.wf)), make([]float32, len(k.bf)), make([]float32, len(k.wp))
					ranks[r] = k
				}
				cl := newCluster(t, tp, sp)
				cl.run(func(r int, g *Group) error {
					k := ranks[r]
					rows := len(k.x) / C
					hw := len(k.bf)
					lf, lp := Linear{N: N, In: C, Out: hw}, Linear{N: N, In: hw, Out: C}
					ln, mean, rstd := make([]float32, rows*C), make([]float32, rows), make([]float32, rows)
					be.LayerNorm(ln, mean, rstd, k.x, lw, lb, rows, C)
					h, hg, y := make([]float32, N*hw), make([]float32, N*hw), make([]float32, rows*C)
					if err := g.ColumnForward(cl.ctx, lf, h, ln, k.wf, k.bf); err != nil {
						return err
					}
					be.Gelu(hg, h)
					if err := g.RowForward(cl.ctx, lp, y, hg, k.wp, bp); err != nil {
						return err
					}
					be.Residual(k.out, k.x, y)
					dhg, dh, dln := make([]float32, N*hw), make([]float32, N*hw), make([]float32, rows*C)
					if err := g.RowBackward(cl.ctx, lp, dhg, k.dwp, k.dbp, k.dout, hg, k.wp); err != nil {
						return err
					}
					be.GeluBackward(dh, h, dhg)
					if err := g.ColumnBackward(cl.ctx, lf, dln, k.dwf, k.dbf, dh, ln, k.wf); err != nil {
						return err
					}
					copy(k.dx, k.dout)
					be.LayerNormBackward(k.dx, k.dlw, k.dlb, dln, k.x, lw, mean, rstd, rows, C)
					if err := g.ReduceReplicated(cl.ctx, k.dlw); err != nil {
						return err
					}
					return g.ReduceReplicated(cl.ctx, k.dlb)
				})
				for r, k := range ranks {
					pre := name(r, false)
					assertScaled(t, pre+" out", k.out, seqPart(t, out, N, C, r, tp, sp))
					assertScaled(t, pre+" dx", k.dx, seqPart(t, dx, N, C, r, tp, sp))
					assertScaled(t, pre+" dc_fc.weight", k.dwf, part(t, Columns, dwf, []int{C, H}, r, tp))
					assertScaled(t, pre+" dc_fc.bias", k.dbf, part(t, Columns, dbf, []int{H}, r, tp))
					assertScaled(t, pre+" dc_proj.weight", k.dwp, part(t, Rows, dwp, []int{H, C}, r, tp))
					assertScaled(t, pre+" dc_proj.bias", k.dbp, dbp)
					assertScaled(t, pre+" dln.weight", k.dlw, dlw)
					assertScaled(t, pre+" dln.bias", k.dlb, dlb)
					if !slices.Equal(k.dlw, ranks[0].dlw) || !slices.Equal(k.dlb, ranks[0].dlb) || !slices.Equal(k.dbp, ranks[0].dbp) {
						t.Errorf("rank %d: a replicated parameter's gradient differs from rank 0's", r)
					}
				}
			})
		}
	}
}
