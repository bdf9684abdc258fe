package kernels

import "fmt"

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major float32
// matrices, where op(X) is X or its transpose. op(A) is m×k, op(B) is k×n
// and C is m×n; lda, ldb and ldc are the row strides of A, B and C as
// stored (so A is m×k with lda ≥ k when transA is false, k×m with lda ≥ m
// when it is true). threads bounds the goroutines used; values below 1 mean
// one. beta == 0 overwrites C without reading it (NaNs in C do not leak).
// Multiplies of less than 3·2²⁰ multiply-adds run on the calling goroutine
// whatever threads says, and threads is capped at GOMAXPROCS.
//
// As in BLAS, A and B are not read when alpha == 0 or k == 0, and C may not
// overlap A or B. Sgemm panics if a dimension is negative, a stride is
// below its row's width or a slice is too short for its matrix.
func Sgemm(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmAt(&gemmLevels[cpuLevel], threads, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmAt is Sgemm with the kernels and block sizes of lv, which the tests
// and benchmarks pick.
func sgemmAt(lv *gemmLevel, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ar, ac, br, bc, ok := checkSgemm(transA, transB, m, n, k, alpha, a, lda, len(b), ldb, beta, c, ldc)
	if !ok {
		return
	}
	raceSgemm(a, ar, ac, lda, b, br, bc, ldb, c, m, n, ldc)
	s := newSgemmCall(lv, threads, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	s.run()
	putSgemmCall(s)
}

// checkSgemm panics on bad arguments, as Sgemm documents, and returns the
// shapes of A and B as stored; ok is false when nothing is left to
// multiply (C is empty, or only scaled by beta, which checkSgemm did).
// nb is the length of B, whatever its element type.
func checkSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, nb int, ldb int, beta float32, c []float32, ldc int) (ar, ac, br, bc int, ok bool) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: Sgemm: negative dimension (m %d, n %d, k %d)", m, n, k))
	}
	if m == 0 || n == 0 {
		return 0, 0, 0, 0, false
	}
	checkGemmMatrix("c", len(c), m, n, ldc)
	if k == 0 || alpha == 0 {
		scaleGemmRows(m, n, beta, c, ldc)
		return 0, 0, 0, 0, false
	}
	ar, ac = m, k
	if transA {
		ar, ac = k, m
	}
	br, bc = k, n
	if transB {
		br, bc = n, k
	}
	checkGemmMatrix("a", len(a), ar, ac, lda)
	checkGemmMatrix("b", nb, br, bc, ldb)
	return ar, ac, br, bc, true
}

// checkGemmMatrix panics unless a slice of length size holds a rows×cols
// matrix with row stride ld: everything after it relies on this, the
// assembly kernels included, to stay inside the slices.
func checkGemmMatrix(name string, size, rows, cols, ld int) {
	if ld < max(cols, 1) {
		panic(fmt.Sprintf("kernels: Sgemm: ld%s = %d, want >= %d", name, ld, max(cols, 1)))
	}
	if need := (rows-1)*ld + cols; size < need {
		panic(fmt.Sprintf("kernels: Sgemm: len(%s) = %d, want >= %d for %d×%d with stride %d", name, size, need, rows, cols, ld))
	}
}

// scaleGemmRows sets C = beta*C, or to zero without reading it when beta == 0.
func scaleGemmRows(m, n int, beta float32, c []float32, ldc int) {
	for i := range m {
		row := c[i*ldc:][:n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

// sgemmRef is the plain triple loop: the reference the fast paths are
// tested against.
func sgemmRef(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				// Index by the layout only: the other index can be
				// past the end of a transposed operand.
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
}
