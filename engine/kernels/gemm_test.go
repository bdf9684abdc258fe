package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// The Sgemm tests run every kernel level this machine has, each with its
// own block sizes and with tiny ones (gemmTestLevels), which take the
// paths that need big matrices at the real sizes (several k blocks, rows
// and columns cut into chunks, several goroutines) on matrices that the
// triple loop checks quickly. TestGemmParallel runs the real sizes on
// multiplies big enough for several goroutines.

// gemmTestLevel is a level under test.
type gemmTestLevel struct {
	name string
	lv   *gemmLevel
}

func gemmTestLevels() []gemmTestLevel {
	var ls []gemmTestLevel
	for l := levelGo; l <= cpuLevel; l++ {
		tiny := gemmLevels[l]
		tiny.kc, tiny.mc, tiny.nc, tiny.minSplit, tiny.minParallel = 5, 2*tiny.mr, 2*tiny.nr, tiny.nr, 0
		ls = append(ls, gemmTestLevel{l.String(), &gemmLevels[l]}, gemmTestLevel{l.String() + "-tiny", &tiny})
	}
	return ls
}

// gemmCase is one multiply: shape, operand layout and scalars.
type gemmCase struct {
	transA, transB bool
	m, n, k        int
	pad            int // added to every stride
	alpha, beta    float32
	threads        int
}

func (tc gemmCase) String() string {
	op := func(t bool) string {
		if t {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s/%dx%dx%d/pad%d/a%g_b%g/t%d", op(tc.transA), op(tc.transB), tc.m, tc.n, tc.k, tc.pad, tc.alpha, tc.beta, tc.threads)
}

// gemmOperands are a case's matrices, as stored, and C's starting values.
type gemmOperands struct {
	a, b, c       []float32
	lda, ldb, ldc int
}

// operands fills A and B with values in [-1, 1) and C with values in
// [-1, 1), or NaN where beta == 0 promises not to read it; the padding
// columns of every stride hold a marker that must survive.
func (tc gemmCase) operands(rng *rand.Rand) gemmOperands {
	ar, ac, br, bc := tc.m, tc.k, tc.k, tc.n
	if tc.transA {
		ar, ac = ac, ar
	}
	if tc.transB {
		br, bc = bc, br
	}
	o := gemmOperands{lda: ac + tc.pad, ldb: bc + tc.pad, ldc: tc.n + tc.pad}
	fill := func(rows, cols, ld int, nan bool) []float32 {
		x := make([]float32, rows*ld)
		for i := range x {
			switch {
			case i%ld >= cols:
				x[i] = gemmPadMark
			case nan:
				x[i] = float32(math.NaN())
			default:
				x[i] = rng.Float32()*2 - 1
			}
		}
		return x
	}
	o.a, o.b = fill(ar, ac, o.lda, false), fill(br, bc, o.ldb, false)
	o.c = fill(tc.m, tc.n, o.ldc, tc.beta == 0)
	return o
}

const gemmPadMark = -12345

// check runs the case at lv and compares every element of C with
// sgemmRef's. Both sum k products in float32 in different orders (the
// kernels in blocks, with fused multiply-adds); each result is within
// γ(k+2)·(|alpha|·Σ|a·b| + |beta·c|) of the exact value, γ(n) = n·u/(1−n·u)
// and u = 2⁻²⁴ (Higham, Accuracy and Stability of Numerical Algorithms,
// 3.1: k−1 additions and one multiplication per product, plus the scaling
// by alpha and the addition of beta·c), so they differ by at most twice
// that. The bound is for the worst case; typical differences are far
// smaller, but a tighter tolerance would depend on the summation order.
func (tc gemmCase) check(t *testing.T, lv *gemmLevel, o gemmOperands) {
	t.Helper()
	got, want := append([]float32(nil), o.c...), append([]float32(nil), o.c...)
	sgemmAt(lv, tc.threads, tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, o.b, o.ldb, tc.beta, got, o.ldc)
	sgemmRef(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, o.b, o.ldb, tc.beta, want, o.ldc)
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
			tol := 2 * gamma * tc.magnitude(o, i, j)
			if math.IsNaN(float64(g)) || math.Abs(float64(g-w)) > tol {
				if bad++; bad <= 5 {
					t.Errorf("C[%d][%d] = %g, want %g (±%.3g)", i, j, g, w, tol)
				}
			}
		}
	}
	if bad > 5 {
		t.Errorf("... and %d more wrong elements", bad-5)
	}
}

// magnitude is |alpha|·Σ|a·b| + |beta·c| for element (i, j), in float64.
func (tc gemmCase) magnitude(o gemmOperands, i, j int) float64 {
	var s float64
	for p := range tc.k {
		var av, bv float32
		if tc.transA {
			av = o.a[p*o.lda+i]
		} else {
			av = o.a[i*o.lda+p]
		}
		if tc.transB {
			bv = o.b[j*o.ldb+p]
		} else {
			bv = o.b[p*o.ldb+j]
		}
		s += math.Abs(float64(av) * float64(bv))
	}
	s *= math.Abs(float64(tc.alpha))
	if tc.beta != 0 {
		s += math.Abs(float64(tc.beta) * float64(o.c[i*o.ldc+j]))
	}
	return s
}

// gemmShapes are m, n, k: ones, odd edges around the tile sizes (4, 6,
// 12, 16, 32) and the k block, and a few big enough for several threads.
var gemmShapes = [][3]int{
	{1, 1, 1}, {1, 7, 1}, {7, 1, 17}, {1, 33, 7}, {7, 7, 7}, {17, 17, 17},
	{33, 33, 33}, {13, 31, 5}, {12, 32, 64}, {25, 65, 1}, {100, 37, 3},
	{37, 100, 259}, {96, 130, 100}, {130, 40, 96}, {100, 100, 100},
	{1024, 17, 20}, // transposed, A's stride is 4 KiB (pack4KTransA)
}

func TestGemm(t *testing.T) {
	scalars := [][2]float32{{1, 0}, {-1.5, 1}, {0.5, -2}}
	rng := rand.New(rand.NewPCG(1, 2))
	i := 0
	for _, tl := range gemmTestLevels() {
		for _, sh := range gemmShapes {
			for _, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, pad := range []int{0, 3} {
					for _, ab := range scalars {
						for _, threads := range []int{1, 2, 3} {
							// -race runs 10x slower: a quarter of the
							// cases there; all of them without it.
							if i++; raceEnabled && i%4 != 0 {
								continue
							}
							tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], pad, ab[0], ab[1], threads}
							t.Run(tl.name+"/"+tc.String(), func(t *testing.T) {
								tc.check(t, tl.lv, tc.operands(rng))
							})
						}
					}
				}
			}
		}
	}
}

// TestGemmParallel runs the levels' own block sizes on shapes above
// minParallel: cut by columns, by rows (n = 64), both (n = 257), with
// several k blocks (k = 300).
func TestGemmParallel(t *testing.T) {
	shapes := [][3]int{{160, 170, 150}, {300, 64, 200}, {130, 400, 70}, {200, 257, 100}, {97, 385, 300}}
	rng := rand.New(rand.NewPCG(9, 10))
	i := 0
	for l := levelGo; l <= cpuLevel; l++ {
		for _, sh := range shapes {
			for _, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, threads := range []int{2, 3} {
					if i++; raceEnabled && i%3 != 0 {
						continue // as in TestGemm
					}
					tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], 3, 0.5, -2, threads}
					if sh[0]*sh[1]*sh[2] < gemmLevels[l].minParallel {
						t.Fatalf("%v is below minParallel", sh)
					}
					t.Run(l.String()+"/"+tc.String(), func(t *testing.T) {
						tc.check(t, &gemmLevels[l], tc.operands(rng))
					})
				}
			}
		}
	}
}

// TestGemmRandom multiplies random shapes, strides, scalars and thread
// counts, with a fixed seed so that a failure repeats.
func TestGemmRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	levels := gemmTestLevels()
	runs := 300
	if testing.Short() || raceEnabled {
		runs = 60
	}
	for r := range runs {
		tc := gemmCase{
			transA: rng.IntN(2) == 1, transB: rng.IntN(2) == 1,
			m: 1 + rng.IntN(90), n: 1 + rng.IntN(90), k: 1 + rng.IntN(300),
			pad: rng.IntN(3) * rng.IntN(40), alpha: float32(rng.IntN(7)-3) / 2, beta: float32(rng.IntN(5)-2) / 2,
			threads: 1 + rng.IntN(3),
		}
		tl := levels[r%len(levels)]
		t.Run(fmt.Sprintf("%d/%s/%v", r, tl.name, tc), func(t *testing.T) {
			tc.check(t, tl.lv, tc.operands(rng))
		})
	}
}

// TestGemmDegenerate covers k == 0 and alpha == 0, where C = beta·C and
// A and B are not read (they are nil here), and m or n == 0, a no-op.
func TestGemmDegenerate(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name        string
		m, n, k     int
		alpha, beta float32
		c, want     []float32
	}{
		{"k0-beta0", 2, 2, 0, 1, 0, []float32{nan, 1, 2, nan}, []float32{0, 0, 0, 0}},
		{"k0-beta2", 2, 2, 0, 1, 2, []float32{1, 2, 3, 4}, []float32{2, 4, 6, 8}},
		{"alpha0-beta1", 2, 2, 3, 0, 1, []float32{1, 2, 3, 4}, []float32{1, 2, 3, 4}},
		{"alpha0-beta0", 1, 3, 3, 0, 0, []float32{nan, nan, 5}, []float32{0, 0, 0}},
		{"m0", 0, 2, 2, 1, 0, []float32{7}, []float32{7}},
		{"n0", 2, 0, 2, 1, 0, []float32{7}, []float32{7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := append([]float32(nil), tt.c...)
			Sgemm(2, false, false, tt.m, tt.n, tt.k, tt.alpha, nil, max(tt.k, 1), nil, max(tt.n, 1), tt.beta, c, max(tt.n, 1))
			for i := range c {
				if c[i] != tt.want[i] {
					t.Fatalf("c = %v, want %v", c, tt.want)
				}
			}
		})
	}
}

// TestGemmPanics checks that bad arguments panic before any kernel reads
// or writes out of bounds.
func TestGemmPanics(t *testing.T) {
	x := make([]float32, 16)
	tests := []struct {
		name string
		f    func()
	}{
		{"negative", func() { Sgemm(1, false, false, -1, 2, 2, 1, x, 2, x, 2, 0, x, 2) }},
		{"lda", func() { Sgemm(1, false, false, 2, 2, 3, 1, x, 2, x, 2, 0, x, 2) }},
		{"ldb-trans", func() { Sgemm(1, false, true, 2, 2, 3, 1, x, 3, x, 2, 0, x, 2) }},
		{"ldc", func() { Sgemm(1, false, false, 2, 3, 2, 1, x, 2, x, 3, 0, x, 2) }},
		{"short-a", func() { Sgemm(1, true, false, 4, 2, 5, 1, x, 4, x, 2, 0, x, 2) }},
		{"short-b", func() { Sgemm(1, false, false, 2, 4, 5, 1, x, 5, x, 4, 0, x, 4) }},
		{"short-c", func() { Sgemm(1, false, false, 5, 4, 1, 1, x, 1, x, 4, 0, x, 4) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			tt.f()
		})
	}
}

// TestGemmConcurrent runs parallel multiplies from several goroutines at
// once, as the model's outer parallel loops do, sharing the helpers.
func TestGemmConcurrent(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cases := make([]gemmCase, 6)
	ops := make([]gemmOperands, len(cases))
	for i := range cases {
		cases[i] = gemmCase{transB: i%2 == 1, m: 160 + i, n: 170, k: 150, alpha: 1, beta: 0.5, threads: 2}
		ops[i] = cases[i].operands(rng)
	}
	var wg sync.WaitGroup
	for i := range cases {
		wg.Go(func() {
			for range 3 {
				cases[i].check(t, &gemmLevels[cpuLevel], ops[i])
			}
		})
	}
	wg.Wait()
}

// TestGemmAllocs checks that a multiply allocates nothing once the pools
// hold its buffers and helpers.
func TestGemmAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops buffers at random under -race")
	}
	for _, threads := range []int{1, 2} {
		t.Run(fmt.Sprintf("t%d", threads), func(t *testing.T) {
			tc := gemmCase{m: 200, n: 300, k: 100, alpha: 1, threads: threads}
			o := tc.operands(rand.New(rand.NewPCG(7, 8)))
			f := func() {
				Sgemm(threads, false, true, tc.m, tc.n, tc.k, 1, o.a, o.lda, o.b, tc.k, 0, o.c, o.ldc)
			}
			if n := testing.AllocsPerRun(50, f); n != 0 {
				t.Errorf("%v allocations per call, want 0", n)
			}
		})
	}
}
