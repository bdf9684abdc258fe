package kernels

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major float32
// matrices, where op(X) is X or its transpose. op(A) is m×k, op(B) is k×n
// and C is m×n; lda, ldb and ldc are the row strides of A, B and C as
// stored (so A is m×k with lda ≥ k when transA is false, k×m with lda ≥ m
// when it is true). threads bounds the goroutines used; values below 1 mean
// one. beta == 0 overwrites C without reading it (NaNs in C do not leak).
func Sgemm(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmRef(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmRef is the plain triple loop: the reference the fast paths are
// tested against.
func sgemmRef(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				av := a[i*lda+p]
				if transA {
					av = a[p*lda+i]
				}
				bv := b[p*ldb+j]
				if transB {
					bv = b[j*ldb+p]
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
