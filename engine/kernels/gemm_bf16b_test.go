package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// SgemmBF16B must give SgemmBF16's result on B decoded, bit for bit, at
// every level (the AVX-512 BF16 packers, the portable ones, the float32
// copies), with subnormal elements of B counting as zero.

// bf16Operand returns B as bfloat16 bits: o.b rounded, one element in
// eight replaced by a subnormal or a signed zero, the padding marked; and
// its exact float32 decoding.
func bf16Operand(rng *rand.Rand, b []float32) ([]uint16, []float32) {
	specials := []uint16{0x0001, 0x8040, 0x007f, 0x0000, 0x8000}
	h, d := make([]uint16, len(b)), make([]float32, len(b))
	for i, v := range b {
		h[i] = bf16Bits(v)
		if v != gemmPadMark && rng.IntN(8) == 0 {
			h[i] = specials[rng.IntN(len(specials))]
		}
		d[i] = math.Float32frombits(uint32(h[i]) << 16)
	}
	return h, d
}

// checkBF16B runs tc at lv with B in bfloat16 and compares C bit for bit
// with SgemmBF16's on B decoded, the padding of C included.
func (tc gemmCase) checkBF16B(t *testing.T, lv *gemmLevel, o gemmOperands, rng *rand.Rand) {
	t.Helper()
	b16, bd := bf16Operand(rng, o.b)
	got, want := append([]float32(nil), o.c...), append([]float32(nil), o.c...)
	sgemmBF16BAt(lv, tc.threads, tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, b16, o.ldb, tc.beta, got, o.ldc)
	sgemmBF16At(lv, tc.threads, tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, bd, o.ldb, tc.beta, want, o.ldc)
	bad := 0
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			if bad++; bad <= 5 {
				t.Errorf("C[%d][%d] = %g (%#08x), want %g (%#08x)", i/o.ldc, i%o.ldc, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
	if bad > 5 {
		t.Errorf("... and %d more wrong elements", bad-5)
	}
}

func TestGemmBF16B(t *testing.T) {
	scalars := [][2]float32{{1, 0}, {1, 1}, {0.5, -2}}
	rng := rand.New(rand.NewPCG(21, 22))
	i := 0
	for _, tl := range bf16TestLevels() {
		for _, sh := range bf16Shapes {
			for _, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, pad := range []int{0, 3} {
					for _, ab := range scalars {
						for _, threads := range []int{1, 3} {
							if i++; raceEnabled && i%4 != 0 {
								continue // as TestGemmBF16
							}
							tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], pad, ab[0], ab[1], threads}
							t.Run(tl.name+"/"+tc.String(), func(t *testing.T) {
								tc.checkBF16B(t, tl.lv, tc.operands(rng), rng)
							})
						}
					}
				}
			}
		}
	}
}

// TestGemmBF16BParallel runs the real block sizes, several goroutines and
// k blocks, and odd strides of B (the transposing packer's rows then
// start at odd 16-bit offsets).
func TestGemmBF16BParallel(t *testing.T) {
	shapes := [][3]int{{160, 170, 150}, {300, 64, 200}, {130, 400, 71}, {97, 385, 1100}}
	rng := rand.New(rand.NewPCG(23, 24))
	for li, tl := range bf16TestLevels() {
		for si, sh := range shapes {
			for ti, trans := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				if raceEnabled && (li+si+ti)%4 != 0 {
					continue // as TestGemmBF16Parallel
				}
				tc := gemmCase{trans[0], trans[1], sh[0], sh[1], sh[2], 3, 1, 1, 3}
				t.Run(tl.name+"/"+tc.String(), func(t *testing.T) {
					tc.checkBF16B(t, tl.lv, tc.operands(rng), rng)
				})
			}
		}
	}
}

// TestGemmBF16BPackers compares the level's 16-bit packers with the
// portable ones on normal values, infinities and zeros (the portable ones
// also flush subnormals and quiet NaNs, which the kernel does for the
// level's: TestGemmBF16B checks that), every column count and k with and
// without a rest.
func TestGemmBF16BPackers(t *testing.T) {
	if gemmBF16Level == nil {
		t.Skip("no AVX-512 BF16 on this CPU")
	}
	ops := gemmBF16Level.bf16
	rng := rand.New(rand.NewPCG(25, 26))
	specials := []uint16{0x7f80, 0xff80, 0x0000, 0x8000, 0x0080, 0x7f7f}
	src := make([]uint16, 40*101)
	for i := range src {
		src[i] = bf16Bits(float32(rng.NormFloat64()))
		if rng.IntN(8) == 0 {
			src[i] = specials[rng.IntN(len(specials))]
		}
	}
	for cols := 1; cols <= 32; cols++ {
		for _, kb := range []int{1, 2, 7, 64} {
			got, want := make([]uint32, 32*32), make([]uint32, 32*32)
			done := ops.pairs16(got, 32, src, 40, kb, cols)
			packPairs16Go(got, 32, src, 40, done, kb, cols)
			packPairs16Go(want, 32, src, 40, 0, kb, cols)
			comparePacked(t, fmt.Sprintf("pairs16/c%d/k%d", cols, kb), got, want)
		}
	}
	for _, ld := range []int{101, 100} {
		for _, kb := range []int{31, 32, 33, 64, 100} {
			got, want := make([]uint32, 64*32), make([]uint32, 64*32)
			done := ops.pairsT16(got, 32, src, ld, 16, kb)
			packPairsT16Go(got, 32, src, ld, done, kb, 16)
			packPairsT16Go(want, 32, src, ld, 0, kb, 16)
			comparePacked(t, fmt.Sprintf("pairsT16/ld%d/k%d", ld, kb), got, want)
		}
	}
}

// TestGemmBF16BPanics: a B too short for its shape panics before any
// kernel runs, at every level.
func TestGemmBF16BPanics(t *testing.T) {
	x, h := make([]float32, 16), make([]uint16, 5)
	for _, tl := range bf16TestLevels() {
		for _, f := range []func(){
			func() { sgemmBF16BAt(tl.lv, 1, false, false, 2, 3, 2, 1, x, 2, h, 3, 0, x, 3) },
			func() { sgemmBF16BAt(tl.lv, 1, false, true, 2, 2, 3, 1, x, 3, h, 3, 0, x, 2) },
			func() { sgemmBF16BAt(tl.lv, 1, false, false, 2, 2, 2, 1, x, 2, h, 1, 0, x, 2) },
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

// TestGemmBF16PairsPanels compares the level's packer of whole panels of
// A transposed with the portable one run panel by panel, on the special
// values of TestGemmBF16Packers, k with and without a rest.
func TestGemmBF16PairsPanels(t *testing.T) {
	if gemmBF16Level == nil {
		t.Skip("no AVX-512 BF16 on this CPU")
	}
	ops := gemmBF16Level.bf16
	rng := rand.New(rand.NewPCG(27, 28))
	specials := []uint32{0x3f808000, 0x3f818000, 0x7f7fffff, 0x7f800001, 0x7fc00000, 0x00400000, 0x807fffff, 0xff800000}
	const ld, panels = 41, 3
	src := make([]float32, 70*ld)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
		if rng.IntN(8) == 0 {
			src[i] = math.Float32frombits(specials[rng.IntN(len(specials))])
		}
	}
	for _, kb := range []int{1, 2, 7, 64, 69} {
		kp := (kb + 1) / 2
		got, want := make([]uint32, panels*kp*12+5), make([]uint32, panels*kp*12+5)
		done := ops.pairsPanels(got, src[1:], ld, kb, panels, kp)
		for p := range panels {
			packPairsGo(got[p*kp*12:][:kp*12], 12, src[1+p*12:], ld, done, kb, 12)
			packPairsGo(want[p*kp*12:][:kp*12], 12, src[1+p*12:], ld, 0, kb, 12)
		}
		comparePacked(t, fmt.Sprintf("pairsPanels/k%d", kb), got, want)
	}
}
