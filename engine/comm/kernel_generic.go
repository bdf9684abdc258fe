//go:build !amd64 || purego

package comm

// Without the assembly kernels (another architecture, or the purego build
// tag) the Go code does all the work.

const cpuLevel = levelGo

func reduceF32SIMD(l simdLevel, op Op, dst, a, b []float32) int           { return 0 }
func reduceHalfSIMD(l simdLevel, dt DType, op Op, dst, a, b []uint16) int { return 0 }
func divF32SIMD(l simdLevel, dst []float32, d float32) int                { return 0 }
func divHalfSIMD(l simdLevel, dt DType, dst []uint16, d float32) int      { return 0 }
func encodeSIMD(l simdLevel, dt DType, dst []uint16, src []float32) int   { return 0 }
func decodeSIMD(l simdLevel, dt DType, dst []float32, src []uint16) int   { return 0 }

// ringCopy is copy(dst, src); see kernel_copy_amd64.go.
func ringCopy(dst, src []byte) int { return copy(dst, src) }

// ringCopyMin: see kernel_copy_amd64.go (here only for the tests).
const ringCopyMin = 4 << 10
