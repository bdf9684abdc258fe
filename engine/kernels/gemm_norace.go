//go:build !race

package kernels

// Without -race raceSgemm compiles away.
func raceSgemm(a []float32, ar, ac, lda int, b []float32, br, bc, ldb int, c []float32, m, n, ldc int) {
}

// Without -race raceReadBF16 compiles away.
func raceReadBF16(b []uint16, rows, cols, ld int) {}

// raceEnabled reports a -race build, under which sync.Pool drops buffers
// at random, so the allocation test is skipped.
const raceEnabled = false
