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

func reduceF32(op Op, dst, a, b []float32) {
	switch op {
	case Sum, Avg:
		sumF32(dst, a, b)
	case Max:
		maxF32(dst, a, b)
	case Min:
		minF32(dst, a, b)
	}
}

// halfBlock is how many 16-bit elements reduceHalf widens at a time: two
// float32 blocks of it stay in L1.
const halfBlock = 512

// reduceHalf reduces bfloat16 or float16 through float32: widen a block of
// each operand, reduce with the float32 kernel, round back.
func reduceHalf(dt DType, op Op, dst, a, b []uint16) {
	var x, y [halfBlock]float32
	for lo := 0; lo < len(dst); lo += halfBlock {
		hi := min(lo+halfBlock, len(dst))
		xs, ys := x[:hi-lo], y[:hi-lo]
		decodeHalf(dt, xs, a[lo:hi])
		decodeHalf(dt, ys, b[lo:hi])
		reduceF32(op, xs, xs, ys)
		encodeHalf(dt, dst[lo:hi], xs)
	}
}

// divide divides every element by n (the last step of Avg), rounding the
// 16-bit dtypes once.
func divide(buf Buffer, n int) {
	switch buf.dt {
	case Float32:
		divF32(buf.f32(), float32(n))
	case BFloat16, Float16:
		var x [halfBlock]float32
		u := buf.u16()
		for lo := 0; lo < len(u); lo += halfBlock {
			hi := min(lo+halfBlock, len(u))
			xs := x[:hi-lo]
			decodeHalf(buf.dt, xs, u[lo:hi])
			divF32(xs, float32(n))
			encodeHalf(buf.dt, u[lo:hi], xs)
		}
	}
}

func decodeHalf(dt DType, dst []float32, src []uint16) {
	if dt == BFloat16 {
		DecodeBF16(dst, src)
	} else {
		DecodeF16(dst, src)
	}
}

func encodeHalf(dt DType, dst []uint16, src []float32) {
	if dt == BFloat16 {
		EncodeBF16(dst, src)
	} else {
		EncodeF16(dst, src)
	}
}

// The float32 kernels below are plain loops over slices resliced to one
// length, so the compiler drops the bounds checks. The gc compiler does not
// vectorise; unrolling by hand did not pay either: an 8-way unrolled sum
// (array pointers, parallel assignment) measured 13.0 GB/s at 4 KiB and
// 12.9 GB/s at 1 MiB against 14.9 and 14.4 for the plain loop, a 4-way one
// 13.5 and 13.8, and an unrolled max was no faster. The plain float32 sum
// runs at memory speed from 1 MiB up; see BenchmarkReduceSum.

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
