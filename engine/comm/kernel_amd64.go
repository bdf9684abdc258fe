//go:build amd64 && !purego

package comm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// cpuLevel is the best kernel level this CPU runs. AVX-512 needs F and BW;
// VBMI2 is asked for as well, as a mark of a core from Ice Lake or Zen 4
// on, which runs 512-bit code at full clock: on this package's development
// machine (AMD EPYC) it doubles the in-cache speed of the kernels, while
// on Skylake-X 512-bit work lowers the clock, which was not measured.
var cpuLevel = func() simdLevel {
	x := &cpu.X86
	switch {
	case x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VBMI2:
		return levelAVX512
	case x.HasAVX2 && x.HasF16C:
		return levelAVX2
	}
	return levelGo
}()

// The kernels (kernel_amd64.s, kernel_avx512_amd64.s), indexed by level
// and, for reductions, by kernelOp.
var (
	reduceF32Kernels = [...][3]func(dst, a, b *float32, n int){
		levelAVX2:   {sumF32AVX2, maxF32AVX2, minF32AVX2},
		levelAVX512: {sumF32AVX512, maxF32AVX512, minF32AVX512},
	}
	reduceBF16Kernels = [...][3]func(dst, a, b *uint16, n int){
		levelAVX2:   {sumBF16AVX2, maxBF16AVX2, minBF16AVX2},
		levelAVX512: {sumBF16AVX512, maxBF16AVX512, minBF16AVX512},
	}
	reduceF16Kernels = [...][3]func(dst, a, b *uint16, n int){
		levelAVX2:   {sumF16AVX2, maxF16AVX2, minF16AVX2},
		levelAVX512: {sumF16AVX512, maxF16AVX512, minF16AVX512},
	}
	divF32Kernels  = [...]func(dst *float32, n int, d float32){levelAVX2: divF32AVX2, levelAVX512: divF32AVX512}
	divBF16Kernels = [...]func(dst *uint16, n int, d float32){levelAVX2: divBF16AVX2, levelAVX512: divBF16AVX512}
	divF16Kernels  = [...]func(dst *uint16, n int, d float32){levelAVX2: divF16AVX2, levelAVX512: divF16AVX512}

	encodeBF16Kernels = [...]func(dst *uint16, src *float32, n int){levelAVX2: encodeBF16AVX2, levelAVX512: encodeBF16AVX512}
	encodeF16Kernels  = [...]func(dst *uint16, src *float32, n int){levelAVX2: encodeF16AVX2, levelAVX512: encodeF16AVX512}
	decodeBF16Kernels = [...]func(dst *float32, src *uint16, n int){levelAVX2: decodeBF16AVX2, levelAVX512: decodeBF16AVX512}
	decodeF16Kernels  = [...]func(dst *float32, src *uint16, n int){levelAVX2: decodeF16AVX2, levelAVX512: decodeF16AVX512}
)

// reduceF32SIMD sets dst = a op b on a prefix of dst with level l's kernel
// and returns the prefix's length. a and b are at least as long as dst.
func reduceF32SIMD(l simdLevel, op Op, dst, a, b []float32) int {
	n, k := len(dst)&^(l.block()-1), kernelOp(op)
	if l == levelGo || n == 0 || k < 0 {
		return 0
	}
	d, x, y := &dst[0], &a[:n][0], &b[:n][0]
	raceReduce(unsafe.Pointer(d), unsafe.Pointer(x), unsafe.Pointer(y), 4*n)
	reduceF32Kernels[l][k](d, x, y, n)
	return n
}

// reduceHalfSIMD is reduceF32SIMD for bfloat16 or float16: widened to
// float32, reduced and rounded back in one pass.
func reduceHalfSIMD(l simdLevel, dt DType, op Op, dst, a, b []uint16) int {
	n, k := len(dst)&^(l.block()-1), kernelOp(op)
	if l == levelGo || n == 0 || k < 0 {
		return 0
	}
	d, x, y := &dst[0], &a[:n][0], &b[:n][0]
	raceReduce(unsafe.Pointer(d), unsafe.Pointer(x), unsafe.Pointer(y), 2*n)
	if dt == BFloat16 {
		reduceBF16Kernels[l][k](d, x, y, n)
	} else {
		reduceF16Kernels[l][k](d, x, y, n)
	}
	return n
}

// divF32SIMD divides a prefix of dst by d and returns its length.
func divF32SIMD(l simdLevel, dst []float32, d float32) int {
	n := len(dst) &^ (l.block() - 1)
	if l == levelGo || n == 0 {
		return 0
	}
	raceUpdate(unsafe.Pointer(&dst[0]), 4*n)
	divF32Kernels[l](&dst[0], n, d)
	return n
}

// divHalfSIMD divides a prefix of the bfloat16 or float16 dst by d,
// rounding once, and returns its length.
func divHalfSIMD(l simdLevel, dt DType, dst []uint16, d float32) int {
	n := len(dst) &^ (l.block() - 1)
	if l == levelGo || n == 0 {
		return 0
	}
	raceUpdate(unsafe.Pointer(&dst[0]), 2*n)
	if dt == BFloat16 {
		divBF16Kernels[l](&dst[0], n, d)
	} else {
		divF16Kernels[l](&dst[0], n, d)
	}
	return n
}

// encodeSIMD rounds a prefix of src into dst (at least as long) as dt and
// returns its length.
func encodeSIMD(l simdLevel, dt DType, dst []uint16, src []float32) int {
	n := len(src) &^ (l.block() - 1)
	if l == levelGo || n == 0 {
		return 0
	}
	d, s := &dst[:n][0], &src[0]
	raceConvert(unsafe.Pointer(d), 2*n, unsafe.Pointer(s), 4*n)
	if dt == BFloat16 {
		encodeBF16Kernels[l](d, s, n)
	} else {
		encodeF16Kernels[l](d, s, n)
	}
	return n
}

// decodeSIMD widens a prefix of the dt src into dst (at least as long) and
// returns its length.
func decodeSIMD(l simdLevel, dt DType, dst []float32, src []uint16) int {
	n := len(src) &^ (l.block() - 1)
	if l == levelGo || n == 0 {
		return 0
	}
	d, s := &dst[:n][0], &src[0]
	raceConvert(unsafe.Pointer(d), 4*n, unsafe.Pointer(s), 2*n)
	if dt == BFloat16 {
		decodeBF16Kernels[l](d, s, n)
	} else {
		decodeF16Kernels[l](d, s, n)
	}
	return n
}
