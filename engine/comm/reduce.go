package comm

import (
	"encoding/binary"
	"fmt"
)

// Op is a reduction operator.
//
// Accuracy: a reduction over p ranks combines p contributions in p-1
// steps (in an order that depends on the algorithm), and each step rounds
// once. For Float32 each step is one float32 operation; BFloat16 and
// Float16 are widened to float32, combined exactly as float32 would, and
// rounded back to nearest-even, as NCCL does. So a Sum is within
// (p-1)·u·Σ|x_i| of the exact sum, with u = 2^-24 (f32), 2^-8 (bf16) or
// 2^-11 (f16); Avg divides the sum once, adding u·|result|; Max and Min
// are exact. The tests hold every collective to these bounds against a
// float64 reference. All ranks get bitwise the same all-reduce result.
type Op uint8

const (
	// Sum adds the contributions.
	Sum Op = iota + 1
	// Avg adds the contributions and divides by the group size, once, at
	// the end (in float32 for the 16-bit dtypes).
	Avg
	// Max takes the largest contribution; NaN wins over any number.
	Max
	// Min takes the smallest contribution; NaN wins over any number.
	Min
)

// opBor is internal: the bitwise OR of the raw bytes. An all-reduce with it
// over a zeroed buffer into which each rank wrote its own block is an exact
// all-gather, for any dtype (NaN payloads and -0 included).
const opBor Op = 0x80

// String returns "sum", "avg", "max" or "min".
func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	case Min:
		return "min"
	case opBor:
		return "bor"
	case 0:
		return "none"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

func (o Op) valid() bool { return o >= Sum && o <= Min }

// reduceInto sets dst[i] = a[i] op b[i] elementwise. dst may be a or b (the
// same memory), never a partial overlap. Avg is Sum here: the caller divides
// once at the end (divide). The 16-bit dtypes are widened to float32,
// reduced, and rounded back to nearest-even, so each call adds at most half
// an ulp of the 16-bit result to the error.
func reduceInto(op Op, dst, a, b Buffer) {
	if op == opBor {
		borBytes(dst.b, a.b, b.b)
		return
	}
	switch dst.dt {
	case Float32:
		reduceF32(op, dst.f32(), a.f32(), b.f32())
	case BFloat16, Float16:
		reduceHalf(dst.dt, op, dst.u16(), a.u16(), b.u16())
	}
}

// reduceF32 runs the SIMD kernel on as much of dst as it takes and the Go
// loops on the rest.
func reduceF32(op Op, dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	i := reduceF32SIMD(cpuLevel, op, dst, a, b)
	reduceF32Generic(op, dst[i:], a[i:], b[i:])
}

func reduceF32Generic(op Op, dst, a, b []float32) {
	switch op {
	case Sum, Avg:
		sumF32(dst, a, b)
	case Max:
		maxF32(dst, a, b)
	case Min:
		minF32(dst, a, b)
	}
}

// halfBlock is how many 16-bit elements reduceHalfGeneric widens at a
// time: two float32 blocks of it stay in L1.
const halfBlock = 512

// reduceHalf reduces bfloat16 or float16 through float32: the SIMD kernel
// fuses widening, reducing and rounding back; the Go code does it a block
// at a time.
func reduceHalf(dt DType, op Op, dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	// The Go code's blocks are zeroed on every call, which costs as much as
	// reducing 2 KiB: call it only for a tail.
	if i := reduceHalfSIMD(cpuLevel, dt, op, dst, a, b); i < len(dst) {
		reduceHalfGeneric(dt, op, dst[i:], a[i:], b[i:])
	}
}

// reduceHalfGeneric widens a block of each operand, reduces with the
// float32 Go loops and rounds back.
func reduceHalfGeneric(dt DType, op Op, dst, a, b []uint16) {
	var x, y [halfBlock]float32
	for lo := 0; lo < len(dst); lo += halfBlock {
		hi := min(lo+halfBlock, len(dst))
		xs, ys := x[:hi-lo], y[:hi-lo]
		decodeHalfGeneric(dt, xs, a[lo:hi])
		decodeHalfGeneric(dt, ys, b[lo:hi])
		reduceF32Generic(op, xs, xs, ys)
		encodeHalfGeneric(dt, dst[lo:hi], xs)
	}
}

// divide divides every element by n (the last step of Avg), rounding the
// 16-bit dtypes once.
func divide(buf Buffer, n int) {
	switch buf.dt {
	case Float32:
		f := buf.f32()
		i := divF32SIMD(cpuLevel, f, float32(n))
		divF32(f[i:], float32(n))
	case BFloat16, Float16:
		u := buf.u16()
		if i := divHalfSIMD(cpuLevel, buf.dt, u, float32(n)); i < len(u) {
			divHalfGeneric(buf.dt, u[i:], float32(n))
		}
	}
}

func divHalfGeneric(dt DType, u []uint16, n float32) {
	var x [halfBlock]float32
	for lo := 0; lo < len(u); lo += halfBlock {
		hi := min(lo+halfBlock, len(u))
		xs := x[:hi-lo]
		decodeHalfGeneric(dt, xs, u[lo:hi])
		divF32(xs, n)
		encodeHalfGeneric(dt, u[lo:hi], xs)
	}
}

func decodeHalfGeneric(dt DType, dst []float32, src []uint16) {
	if dt == BFloat16 {
		decodeBF16Generic(dst, src)
	} else {
		decodeF16Generic(dst, src)
	}
}

func encodeHalfGeneric(dt DType, dst []uint16, src []float32) {
	if dt == BFloat16 {
		encodeBF16Generic(dst, src)
	} else {
		encodeF16Generic(dst, src)
	}
}

// Kernel speed. The float32 loops below are the Go kernels: what runs
// without the assembly (another architecture, or -tags purego), on the
// tails it leaves (under one block of 16 or 32 elements), and the
// reference it matches bit for bit (kernel_test.go). They are plain loops
// over slices resliced to one length, so the compiler drops the bounds
// checks. The gc compiler does not vectorise, and unrolling by hand did
// not pay (an 8-way unrolled sum measured 13.0 GB/s at 4 KiB against 14.9
// for the plain loop). The assembly (kernel_amd64.s with AVX2 and F16C,
// kernel_avx512_amd64.s with AVX-512, chosen at start by cpuLevel) does
// the 16-bit ones in one pass: widen, reduce and round back per register.
//
// BenchmarkKernelReduce, in GB/s of dst (a reduction moves three times
// that), medians of 5 runs on the 2-core development VM (AMD EPYC with
// AVX-512, 48 KiB L1d, 1 MiB L2, 32 MiB L3; go1.26):
//
//	                4 KiB  64 KiB  1 MiB  16 MiB
//	f32 sum  go      15.3    15.7   15.0    12.7
//	         avx2    94.0    64.1   35.3    21.5
//	         avx512 149.0    64.5   35.8    19.0
//	f32 max  go       7.4     7.4    7.5     7.2
//	         avx512 138.3    63.6   35.8    18.1
//	bf16 sum go       1.36    1.40   1.38    1.36
//	         avx2    28.1    28.5   27.3    14.4
//	         avx512  54.8    55.8   34.6    15.9
//	f16 sum  go       0.65    0.64   0.64    0.63
//	         avx2    30.1    31.2   29.1    15.0
//	         avx512  48.4    48.6   34.3    15.6
//
// Min runs like Max. The bfloat16 Max and Min, which need no rounding, run
// faster than the sum in cache (71 GB/s at 4 KiB with AVX-512), the
// float16 ones slower (37). In cache AVX-512 runs up to twice as fast as
// AVX2; from memory they are within the noise of each other (runs of the
// 16 MiB sums vary by ±20% on this VM). 16 MiB is memory speed: the three buffers do
// not fit in L3, and at 64 MiB a float32 sum reaches 13 GB/s of dst, 40
// GB/s of reads and writes (more with the write-allocate of dst), where
// copy() moves 47 GB/s (read plus write). BenchmarkKernelDivide and BenchmarkKernelConvert
// measure the division and the conversions the same way.

func sumF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func maxF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		// NaN wins, whichever side it is on.
		if x, y := a[i], b[i]; x > y || x != x {
			dst[i] = x
		} else {
			dst[i] = y
		}
	}
}

func minF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		if x, y := a[i], b[i]; x < y || x != x {
			dst[i] = x
		} else {
			dst[i] = y
		}
	}
}

func divF32(dst []float32, n float32) {
	for i := range dst {
		dst[i] /= n
	}
}

// borBytes ORs a and b into dst, eight bytes at a time.
func borBytes(dst, a, b []byte) {
	n := len(dst)
	a, b = a[:n], b[:n]
	le := binary.LittleEndian
	i := 0
	for ; i <= n-8; i += 8 {
		le.PutUint64(dst[i:], le.Uint64(a[i:])|le.Uint64(b[i:]))
	}
	for ; i < n; i++ {
		dst[i] = a[i] | b[i]
	}
}
