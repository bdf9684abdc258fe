package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The SgemmBF16 tests run every way it multiplies: the AVX-512 BF16 level
// where this CPU has it, a portable bf16 level (gemmBF16GoLevel: the same
// driver and packing with a Go kernel that adds as VDPBF16PS does, and
// 4×8 tiles, so that the edges fall elsewhere) and the rounded copies on
// every float32 level, each also with tiny blocks. With alpha 1 and beta 0
// or 1 every result is compared bit for bit with sgemmBF16Ref, which adds
// the same exact products in the level's order; other scalars are held to
// Sgemm's bound around the product of the rounded operands.

// gemmBF16GoLevel is the portable bf16 level of the tests: Go kernel, no
// packers but the portable ones.
var gemmBF16GoLevel = gemmLevel{
	mr: 4, nr: 8, kc: 64, mc: 64, nc: 64, minSplit: 16, minParallel: gemmMinParallel,
	bf16: &bf16Ops{
		kern:   kernBF16Go(4, 8),
		pairs:  func([]uint32, int, []float32, int, int, int) int { return 0 },
		pairsT: func([]uint32, int, []float32, int, int, int) int { return 0 },
	},
}

// kernBF16Go is an mr×nr bf16 kernel in Go: per pair, the odd product and
// then the even one added to each sum (products of bfloat16 are exact in
// float32), as VDPBF16PS does.
func kernBF16Go(mr, nr int) func(kp int, a, b []uint32, c []float32, ldc int, alpha, beta float32) {
	return func(kp int, a, b []uint32, c []float32, ldc int, alpha, beta float32) {
		for i := range mr {
			for j := range nr {
				var s float32
				for q := range kp {
					x, y := a[q*mr+i], b[q*nr+j]
					s += bf16Hi(x) * bf16Hi(y)
					s += bf16Lo(x) * bf16Lo(y)
				}
				if beta == 0 {
					c[i*ldc+j] = alpha * s
				} else {
					c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
				}
			}
		}
	}
}

func bf16Lo(x uint32) float32 { return math.Float32frombits(x << 16) }
func bf16Hi(x uint32) float32 { return math.Float32frombits(x &^ 0xffff) }

// bf16TestLevel is a way SgemmBF16 multiplies.
type bf16TestLevel struct {
	name string
	lv   *gemmLevel
}

func bf16TestLevels() []bf16TestLevel {
	var ls []bf16TestLevel
	add := func(name string, lv *gemmLevel) {
		tiny := *lv
		tiny.kc, tiny.mc, tiny.nc, tiny.minSplit, tiny.minParallel = 5, 2*tiny.mr, 2*tiny.nr, tiny.nr, 0
		ls = append(ls, bf16TestLevel{name, lv}, bf16TestLevel{name + "-tiny", &tiny})
	}
	if gemmBF16Level != nil {
		add("avx512bf16", gemmBF16Level)
	}
	add("bf16go", &gemmBF16GoLevel)
	for l := levelGo; l <= cpuLevel; l++ {
		add("copies-"+l.String(), &gemmLevels[l])
	}
	return ls
}

// sgemmBF16Ref is C = op(A)·op(B) + beta·C (alpha 1, beta 0 or 1) on A
// and B rounded to bfloat16, adding the products as lv does: in blocks of
// k of gemmKC, each summed from zero and then added to C; within a block
// in pairs, odd element first, on a bf16 level, in order on a float32 one.
func sgemmBF16Ref(lv *gemmLevel, transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	at := func(i, p int) float32 {
		if transA {
			return roundBF16(a[p*lda+i])
		}
		return roundBF16(a[i*lda+p])
	}
	bt := func(p, j int) float32 {
		if transB {
			return roundBF16(b[j*ldb+p])
		}
		return roundBF16(b[p*ldb+j])
	}
	kc := gemmKC(lv, k)
	for i := range m {
		for j := range n {
			for p0 := 0; p0 < k; p0 += kc {
				p1 := min(p0+kc, k)
				var s float32
				for p := p0; p < p1; p++ {
					if lv.bf16 == nil {
						s += at(i, p) * bt(p, j)
						continue
					}
					if p+1 < p1 {
						s += at(i, p+1) * bt(p+1, j)
					}
					s += at(i, p) * bt(p, j)
					p++ // the pair's odd element is done
				}
				if p0 == 0 && beta == 0 {
					c[i*ldc+j] = s
				} else {
					c[i*ldc+j] += s
				}
			}
		}
	}
}

// checkBF16 runs tc at lv and compares C with sgemmBF16Ref bit for bit
// (alpha 1, beta 0 or 1), or else with sgemmRef on the rounded operands
// within Sgemm's bound (see gemmCase.check); the padding of C must keep
// its marker.
func (tc gemmCase) checkBF16(t *testing.T, lv *gemmLevel, o gemmOperands) {
	t.Helper()
	got, want := append([]float32(nil), o.c...), append([]float32(nil), o.c...)
	sgemmBF16At(lv, tc.threads, tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, o.b, o.ldb, tc.beta, got, o.ldc)
	exact := tc.alpha == 1 && (tc.beta == 0 || tc.beta == 1)
	r := o
	r.a, r.b = roundedCopy(o.a), roundedCopy(o.b)
	if exact {
		sgemmBF16Ref(lv, tc.transA, tc.transB, tc.m, tc.n, tc.k, o.a, o.lda, o.b, o.ldb, tc.beta, want, o.ldc)
	} else {
		sgemmRef(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, r.a, r.lda, r.b, r.ldb, tc.beta, want, o.ldc)
	}
	u := math.Ldexp(1, -24)
	gamma := float64(tc.k+2) * u / (1 - float64(tc.k+2)*u)
	bad := 0
	for i := range tc.m {
		for j := range o.ldc {
			g, w := got[i*o.ldc+j], want[i*o.ldc+j]
			if j >= tc.n {
				if g != gemmPadMark {
					t.Fatalf("C[%d][%d] = %g in the padding, want it untouched", i, j, g)
				}
				continue
			}
			ok := math.Float32bits(g) == math.Float32bits(w)
			tol := 0.0
			if !exact {
				tol = 2 * gamma * tc.magnitude(r, i, j)
				ok = !math.IsNaN(float64(g)) && math.Abs(float64(g-w)) <= tol
			}
			if !ok {
				if bad++; bad <= 5 {
					t.Errorf("C[%d][%d] = %g (%#08x), want %g (%#08x) ±%.3g", i, j, g, math.Float32bits(g), w, math.Float32bits(w), tol)
				}
			}
		}
	}
	if bad > 5 {
		t.Errorf("... and %d more wrong elements", bad-5)
	}
}

func roundedCopy(x []float32) []float32 {
	r := make([]float32, len(x))
	for i, v := range x {
		r[i] = roundBF16(v)
	}
	return r
}

// bf16Shapes are gemmShapes and more odd k (k odd leaves a lone element in
// the last pair; k = 33, 65 and 97 a 32-element block of the transposing
// packer and a rest).
var bf16Shapes = append([][3]int{{5, 40, 3}, {13, 33, 65}, {25, 70, 97}, {40, 64, 64}}, gemmShapes...)

func TestGemmBF16(t *testing.T) {
	scalars := [][2]float32{{1, 0}, {1, 1}, {0.5, -2}}
	rng := rand.New(rand.NewPCG(11, 12))
	i := 0
	for _, tl := range bf16TestLevels() {
		for _, sh := range bf16Shapes {
			for _, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, pad := range []int{0, 3} {
					for _, ab := range scalars {
						for _, threads := range []int{1, 3} {
							if i++; raceEnabled && i%4 != 0 {
								continue // as TestGemm
							}
							tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], pad, ab[0], ab[1], threads}
							t.Run(tl.name+"/"+tc.String(), func(t *testing.T) {
								tc.checkBF16(t, tl.lv, tc.operands(rng))
							})
						}
					}
				}
			}
		}
	}
}

// TestGemmBF16Parallel runs the real block sizes on multiplies above
// minParallel, on several goroutines, with several k blocks (k = 1100).
func TestGemmBF16Parallel(t *testing.T) {
	shapes := [][3]int{{160, 170, 150}, {300, 64, 200}, {130, 400, 71}, {97, 385, 1100}}
	rng := rand.New(rand.NewPCG(13, 14))
	for li, tl := range bf16TestLevels() {
		for si, sh := range shapes {
			for ti, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], 3, 1, 1, 3}
				if sh[0]*sh[1]*sh[2] < gemmMinParallel {
					t.Fatalf("%v is below minParallel", sh)
				}
				// -race runs the scalar reference 10x slower: one
				// transpose in four of each shape and level, a different
				// one per shape and level, so every transpose still runs.
				if raceEnabled && (li+si+ti)%4 != 0 {
					continue
				}
				t.Run(tl.name+"/"+tc.String(), func(t *testing.T) {
					tc.checkBF16(t, tl.lv, tc.operands(rng))
				})
			}
		}
	}
}

// TestBF16Rounding checks bf16Bits on the cases that matter: ties to
// even, carries into the exponent and to Inf, NaN, subnormals to zero.
func TestBF16Rounding(t *testing.T) {
	tests := []struct{ in, want uint32 }{
		{0x3f808000, 0x3f80}, // tie, even: down
		{0x3f818000, 0x3f82}, // tie, odd: up
		{0x3f808001, 0x3f81}, // above the tie
		{0x3f7fffff, 0x3f80}, // carry into the exponent
		{0x7f7fffff, 0x7f80}, // to Inf
		{0xff800000, 0xff80}, // -Inf
		{0x7fc00000, 0x7fc0}, // quiet NaN
		{0x7f800001, 0x7fc0}, // signalling NaN made quiet, not Inf
		{0x00400000, 0x0000}, // subnormal
		{0x807fffff, 0x8000}, // negative subnormal: -0
		{0x00800000, 0x0080}, // smallest normal
	}
	for _, tt := range tests {
		if got := bf16Bits(math.Float32frombits(tt.in)); uint32(got) != tt.want {
			t.Errorf("bf16Bits(%#08x) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
}

// TestGemmBF16Packers compares the level's packers with the portable ones
// on data with the special values of TestBF16Rounding, every width and
// row count they take, and k with and without a rest.
func TestGemmBF16Packers(t *testing.T) {
	if gemmBF16Level == nil {
		t.Skip("no AVX-512 BF16 on this CPU")
	}
	ops := gemmBF16Level.bf16
	rng := rand.New(rand.NewPCG(15, 16))
	specials := []uint32{0x3f808000, 0x3f818000, 0x7f7fffff, 0x7f800001, 0x7fc00000, 0x00400000, 0x807fffff, 0xff800000}
	src := make([]float32, 40*101)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
		if rng.IntN(8) == 0 {
			src[i] = math.Float32frombits(specials[rng.IntN(len(specials))])
		}
	}
	const ld = 40
	for _, dstw := range []int{12, 32} {
		for cols := 1; cols <= dstw; cols++ {
			for _, kb := range []int{1, 2, 7, 64} {
				got, want := make([]uint32, 32*dstw), make([]uint32, 32*dstw)
				done := ops.pairs(got, dstw, src, ld, kb, cols)
				packPairsGo(got, dstw, src, ld, done, kb, cols)
				packPairsGo(want, dstw, src, ld, 0, kb, cols)
				comparePacked(t, fmt.Sprintf("pairs/w%d/c%d/k%d", dstw, cols, kb), got, want)
			}
		}
	}
	for _, rows := range []int{12, 16} {
		for _, kb := range []int{31, 32, 33, 64, 100} {
			got, want := make([]uint32, 64*32), make([]uint32, 64*32)
			done := ops.pairsT(got, 32, src, 101, rows, kb)
			packPairsTGo(got, 32, src, 101, done, kb, rows)
			packPairsTGo(want, 32, src, 101, 0, kb, rows)
			comparePacked(t, fmt.Sprintf("pairsT/r%d/k%d", rows, kb), got, want)
		}
	}
}

func comparePacked(t *testing.T, name string, got, want []uint32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: dword %d = %#08x, want %#08x", name, i, got[i], want[i])
			return
		}
	}
}

// TestGemmBF16Panics: bad arguments panic before any kernel runs, at every
// level, as Sgemm's do.
func TestGemmBF16Panics(t *testing.T) {
	x := make([]float32, 16)
	for _, tl := range bf16TestLevels() {
		for _, f := range []func(){
			func() { sgemmBF16At(tl.lv, 1, false, false, -1, 2, 2, 1, x, 2, x, 2, 0, x, 2) },
			func() { sgemmBF16At(tl.lv, 1, true, false, 4, 2, 5, 1, x, 4, x, 2, 0, x, 2) },
			func() { sgemmBF16At(tl.lv, 1, false, true, 2, 2, 3, 1, x, 3, x, 2, 0, x, 2) },
			func() { sgemmBF16At(tl.lv, 1, false, false, 5, 4, 1, 1, x, 1, x, 4, 0, x, 4) },
		} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s: no panic", tl.name)
					}
				}()
				f()
			}()
		}
	}
}

// TestGemmBF16Degenerate: k == 0 and alpha == 0 scale C and read neither
// A nor B (nil here), at every level.
func TestGemmBF16Degenerate(t *testing.T) {
	nan := float32(math.NaN())
	for _, tl := range bf16TestLevels() {
		c := []float32{nan, 1, 2, nan}
		sgemmBF16At(tl.lv, 2, false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0, c, 2)
		c2 := []float32{1, 2, 3, 4}
		sgemmBF16At(tl.lv, 2, true, true, 2, 2, 3, 0, nil, 2, nil, 3, 2, c2, 2)
		if c[0] != 0 || c[3] != 0 || c2[3] != 8 {
			t.Errorf("%s: k = 0: %v, alpha = 0: %v; want zeros and 2·C", tl.name, c, c2)
		}
	}
}

// TestGemmBF16Allocs: a multiply allocates nothing once the pools hold its
// buffers and helpers.
func TestGemmBF16Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops buffers at random under -race")
	}
	for _, threads := range []int{1, 2} {
		tc := gemmCase{m: 200, n: 300, k: 101, alpha: 1, threads: threads}
		o := tc.operands(rand.New(rand.NewPCG(7, 8)))
		f := func() {
			SgemmBF16(threads, false, true, tc.m, tc.n, tc.k, 1, o.a, o.lda, o.b, tc.k, 0, o.c, o.ldc)
		}
		if n := testing.AllocsPerRun(50, f); n != 0 {
			t.Errorf("t%d: %v allocations per call, want 0", threads, n)
		}
	}
}
