//go:build race

package kernels

import (
	"runtime"
	"unsafe"
)

// raceSgemm tells the race detector what a multiply reads and writes: it
// does not see the assembly kernels' accesses. Row by row, and only each
// row's own columns, since callers run multiplies on neighbouring
// submatrices of one buffer at once (attention heads share the rows of
// (T, 3C) and (T, C) buffers).
func raceSgemm(a []float32, ar, ac, lda int, b []float32, br, bc, ldb int, c []float32, m, n, ldc int) {
	const f = int(unsafe.Sizeof(float32(0)))
	for i := range ar {
		runtime.RaceReadRange(unsafe.Pointer(&a[i*lda]), ac*f)
	}
	for i := range br {
		runtime.RaceReadRange(unsafe.Pointer(&b[i*ldb]), bc*f)
	}
	for i := range m {
		runtime.RaceWriteRange(unsafe.Pointer(&c[i*ldc]), n*f)
	}
}

// raceReadBF16 tells the race detector that a multiply reads the rows×cols
// bfloat16 matrix b (row stride ld), as raceSgemm does for float32 ones.
func raceReadBF16(b []uint16, rows, cols, ld int) {
	for i := range rows {
		runtime.RaceReadRange(unsafe.Pointer(&b[i*ld]), cols*2)
	}
}

const raceEnabled = true
