//go:build amd64 && !purego

package kernels

// gemmAsmKernel is the signature of the assembly micro-kernels (see
// gemmKernel).
type gemmAsmKernel func(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

// wrapGemmKernel makes an mr×nr assembly kernel a gemmKernel. Its bounds
// checks (three per call of thousands of multiply-adds) keep a wrong
// block size from writing outside the slices.
func wrapGemmKernel(f gemmAsmKernel, mr, nr int, trans bool) gemmKernel {
	return func(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32) {
		if trans {
			_ = a[(k-1)*lda+mr-1]
		} else {
			_ = a[(mr-1)*lda+k-1]
		}
		_ = b[k*nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		f(k, &a[0], lda, &b[0], &c[0], ldc, alpha, beta)
	}
}

// gemmAsmLevel is the gemmLevel of mr×nr assembly kernels and a transposing
// packer for B.
func gemmAsmLevel(mr, nr, kc, mc, nc int, n, t gemmAsmKernel, packBT func(dst, src []float32, ldb, kb int) int) gemmLevel {
	return gemmLevel{mr: mr, nr: nr, kc: kc, mc: mc, nc: nc, minSplit: 2 * nr, minParallel: gemmMinParallel,
		kernN: wrapGemmKernel(n, mr, nr, false), kernT: wrapGemmKernel(t, mr, nr, true), packBT: packBT}
}

// gemmLevels are the kernels of each level and their block sizes, which
// keep a kc×nc block of B (384 KiB for AVX-512) in a 1 MiB L2 cache with
// room for A and C, and a kc-long panel of A (12 KiB) in L1 while the
// panels of B stream past it. kc from 128 to 384 and nc from 256 to 768
// ran within 5% of each other on one core. mc only bounds a chunk's rows:
// A is read in place.
var gemmLevels = [...]gemmLevel{
	levelGo: gemmGoLevel,
	levelAVX2: func() gemmLevel {
		lv := gemmAsmLevel(6, 16, 256, 1536, 256, k6x16N, k6x16T, packBT16)
		lv.pack4KTransA = true
		return lv
	}(),
	levelAVX512: gemmAsmLevel(12, 32, 256, 1536, 384, k12x32N, k12x32T, packBT32),
}

// packBT16 transposes 8 rows at a time of a 16-column panel of Bᵀ.
func packBT16(dst, src []float32, ldb, kb int) int {
	n := kb &^ 7
	if n == 0 {
		return 0
	}
	_ = src[15*ldb+n-1]
	_ = dst[n*16-1]
	packBT16AVX2(&dst[0], &src[0], ldb, n)
	return n
}

// packBT32 transposes 16 rows at a time of a 32-column panel of Bᵀ.
func packBT32(dst, src []float32, ldb, kb int) int {
	n := kb &^ 15
	if n == 0 {
		return 0
	}
	_ = src[31*ldb+n-1]
	_ = dst[n*32-1]
	packBT32AVX512(&dst[0], &src[0], ldb, n)
	return n
}

//go:noescape
func k12x32N(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func k12x32T(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func k6x16N(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func k6x16T(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func packBT32AVX512(dst, src *float32, ldb, kb int)

//go:noescape
func packBT16AVX2(dst, src *float32, ldb, kb int)
