package kernels

// gemmKernel computes one mr×nr tile of C: C = alpha·A·B + beta·C, where
// A is mr×k and B is k×nr packed (row p at b[p*nr:]), and C has row stride
// ldc. beta == 0 does not read C. kernN reads A in place along its rows
// (element (i, p) at a[i*lda+p]), kernT along its columns (at a[p*lda+i]).
type gemmKernel func(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32)

// gemmLevel is a level's micro-kernels and the block sizes that suit them.
type gemmLevel struct {
	mr, nr       int // tile of C a kernel call computes
	kc           int // most of k per packed block of B
	mc, nc       int // most rows and columns of C per chunk
	minSplit     int // the fewest columns per goroutine worth cutting C by columns
	minParallel  int // the least m·n·k worth more than one goroutine
	kernN, kernT gemmKernel
	packA        bool // pack every panel of A, not only the last rows (kernN unused)
	// pack4KTransA packs every panel of a transposed A whose stride is a
	// multiple of 4 KiB: read in place, a panel's kc columns then fall
	// into one set of a 48 KiB 12-way L1 cache (and a few of the L2) and
	// evict each other. The AVX2 kernels ran at 65% of their speed on such
	// strides, and 5-12% slower on others when they always packed; the
	// AVX-512 ones, with twice the work per column, lost nothing.
	pack4KTransA bool

	// packBT, if not nil, transposes the first rows of a whole panel of
	// Bᵀ faster than packGemmBTGo, which it is called like, from row 0, and
	// returns how many rows it did.
	packBT func(dst, src []float32, ldb, kb int) int

	// bf16, if not nil, makes this a level of SgemmBF16: kernN, kernT,
	// packA and packBT are unused (see gemm_bf16_driver.go).
	bf16 *bf16Ops
}

// gemmGoLevel is the portable kernel. It always packs A, so that the kernel
// reads both operands in order with one bounds check per step of k. 4×4
// suits arm64, where the 16 sums, a row of B and an element of A stay in
// its 32 floating-point registers and each update compiles to one FMADDS;
// amd64, with 15 usable X registers, spills some (about 4 GFLOP/s on the
// development machine; there the purego build is for tests, and only CPUs
// from before AVX2 run this kernel in the default build).
var gemmGoLevel = gemmLevel{
	mr: 4, nr: 4, kc: 256, mc: 256, nc: 256, minSplit: 64, minParallel: gemmMinParallel, packA: true,
	kernT: gemmKernelGo,
}

// gemmKernelGo is the 4×4 micro-kernel in Go for packed A (lda == 4).
func gemmKernelGo(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	a, b = a[:4*k], b[:4*k]
	for len(a) >= 4 && len(b) >= 4 {
		// One statement per sum, so that each is a multiply-add of
		// its own (a tuple assignment builds all 16 products first).
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		x := a[0]
		c00 += x * b0
		c01 += x * b1
		c02 += x * b2
		c03 += x * b3
		x = a[1]
		c10 += x * b0
		c11 += x * b1
		c12 += x * b2
		c13 += x * b3
		x = a[2]
		c20 += x * b0
		c21 += x * b1
		c22 += x * b2
		c23 += x * b3
		x = a[3]
		c30 += x * b0
		c31 += x * b1
		c32 += x * b2
		c33 += x * b3
		a, b = a[4:], b[4:]
	}
	storeGemmRow4(c, alpha, beta, c00, c01, c02, c03)
	storeGemmRow4(c[ldc:], alpha, beta, c10, c11, c12, c13)
	storeGemmRow4(c[2*ldc:], alpha, beta, c20, c21, c22, c23)
	storeGemmRow4(c[3*ldc:], alpha, beta, c30, c31, c32, c33)
}

// storeGemmRow4 sets c[:4] = alpha*s + beta*c[:4], not reading c if beta == 0.
func storeGemmRow4(c []float32, alpha, beta, s0, s1, s2, s3 float32) {
	c = c[:4]
	if beta == 0 {
		c[0], c[1], c[2], c[3] = alpha*s0, alpha*s1, alpha*s2, alpha*s3
		return
	}
	c[0], c[1], c[2], c[3] = alpha*s0+beta*c[0], alpha*s1+beta*c[1], alpha*s2+beta*c[2], alpha*s3+beta*c[3]
}
