//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// gemmBF16Level is SgemmBF16's level: the AVX-512 BF16 kernel where the CPU
// has it (x/sys/cpu reports AVX-512 only when the OS saves its registers),
// else nil, for the rounded copies and Sgemm's kernels.
var gemmBF16Level = func() *gemmLevel {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BW || !cpu.X86.HasAVX512BF16 {
		return nil
	}
	return &gemmBF16AVX512
}()

// gemmBF16AVX512 is the 12×32 VDPBF16PS kernel with the float32 AVX-512
// level's blocks, kc doubled: a kc×nc block of packed B still takes 384
// KiB, and a panel of A 12 KiB.
var gemmBF16AVX512 = gemmLevel{
	mr: 12, nr: 32, kc: 512, mc: 1536, nc: 384, minSplit: 64, minParallel: gemmMinParallel,
	bf16: &bf16Ops{kern: kernBF16AVX512, pairs: packPairs, pairsT: packPairsT, pairs16: packPairs16, pairsT16: packPairsT16,
		pairsPanels: packPairsPanels},
}

// kernBF16AVX512 checks the bounds of a 12×32 tile (three checks per call
// of thousands of multiply-adds) and runs the kernel.
func kernBF16AVX512(kp int, a, b []uint32, c []float32, ldc int, alpha, beta float32) {
	_ = a[kp*12-1]
	_ = b[kp*32-1]
	_ = c[11*ldc+31]
	k12x32BF16(kp, &a[0], &b[0], &c[0], ldc, alpha, beta)
}

// packPairs packs the kb/2 whole pairs of a panel whose k runs down the
// rows, cols ≤ dstw columns of dstw (12 or 32), with masked loads and
// stores: the columns past cols are not read and become zero.
func packPairs(dst []uint32, dstw int, src []float32, ld, kb, cols int) int {
	pairs := kb / 2
	if pairs == 0 {
		return 0
	}
	_ = src[(2*pairs-1)*ld+cols-1]
	_ = dst[pairs*dstw-1]
	packPairsAVX512(&dst[0], dstw, &src[0], ld, pairs, uint32(1)<<cols-1, uint32(1)<<dstw-1)
	return 2 * pairs
}

// packPairsT packs the first 32·⌊kb/32⌋ elements of rows rows (12 or 16)
// of a panel whose k runs along the rows.
func packPairsT(dst []uint32, dstw int, src []float32, ld, rows, kb int) int {
	blocks := kb / 32
	if blocks == 0 {
		return 0
	}
	_ = src[(rows-1)*ld+32*blocks-1]
	_ = dst[(16*blocks-1)*dstw+rows-1]
	packPairsTAVX512(&dst[0], dstw, &src[0], ld, rows, blocks, uint32(1)<<rows-1)
	return 32 * blocks
}

//go:noescape
func k12x32BF16(kp int, a, b *uint32, c *float32, ldc int, alpha, beta float32)

//go:noescape
func packPairsAVX512(dst *uint32, dstw int, src *float32, ld, pairs int, load, store uint32)

//go:noescape
func packPairsTAVX512(dst *uint32, dstw int, src *float32, ld, rows, blocks int, store uint32)

// packPairs16 packs the kb/2 whole pairs of a 32-column panel of
// bfloat16 whose k runs down the rows, cols ≤ 32 of them, with masked
// loads: the columns past cols are not read and become zero.
func packPairs16(dst []uint32, dstw int, src []uint16, ld, kb, cols int) int {
	pairs := kb / 2
	if pairs == 0 || dstw != 32 {
		return 0
	}
	_ = src[(2*pairs-1)*ld+cols-1]
	_ = dst[pairs*32-1]
	packPairs16AVX512(&dst[0], &src[0], ld, pairs, uint32(1)<<cols-1)
	return 2 * pairs
}

// packPairsT16 packs the first 32·⌊kb/32⌋ elements of 16 rows of
// bfloat16 whose k runs along the rows.
func packPairsT16(dst []uint32, dstw int, src []uint16, ld, rows, kb int) int {
	blocks := kb / 32
	if blocks == 0 || rows != 16 {
		return 0
	}
	_ = src[15*ld+32*blocks-1]
	_ = dst[(16*blocks-1)*dstw+15]
	packPairsT16AVX512(&dst[0], dstw, &src[0], ld, blocks)
	return 32 * blocks
}

// packPairsPanels packs the kb/2 whole pairs of panels whole 12-row
// panels of A transposed (panel p from column 12p of src), kp pairs apart
// in dst.
func packPairsPanels(dst []uint32, src []float32, ld, kb, panels, kp int) int {
	pairs := kb / 2
	if pairs == 0 || panels == 0 {
		return 0
	}
	_ = src[(2*pairs-1)*ld+12*panels-1]
	_ = dst[(panels-1)*kp*12+pairs*12-1]
	packPairsPanelsAVX512(&dst[0], &src[0], ld, pairs, panels, kp*12*4)
	return 2 * pairs
}

//go:noescape
func packPairsPanelsAVX512(dst *uint32, src *float32, ld, pairs, panels, pstride int)

//go:noescape
func packPairs16AVX512(dst *uint32, src *uint16, ld, pairs int, load uint32)

//go:noescape
func packPairsT16AVX512(dst *uint32, dstw int, src *uint16, ld, blocks int)
