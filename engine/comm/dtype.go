package comm

import (
	"fmt"
	"strings"
	"unsafe"
)

// DType is the element type of a Buffer.
type DType uint8

const (
	// Float32 is IEEE 754 binary32.
	Float32 DType = iota + 1
	// BFloat16 is bfloat16 (the upper half of a float32), stored as the
	// uint16 of its bits.
	BFloat16
	// Float16 is IEEE 754 binary16, stored as the uint16 of its bits.
	Float16
)

// Size returns the size of one element in bytes (0 for an invalid DType).
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case BFloat16, Float16:
		return 2
	}
	return 0
}

// String returns "f32", "bf16" or "f16".
func (d DType) String() string {
	switch d {
	case Float32:
		return "f32"
	case BFloat16:
		return "bf16"
	case Float16:
		return "f16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Buffer is a typed view of memory that an operation reads or writes. It
// does not copy: the slice it was made from is the memory the operation
// uses. The zero Buffer is empty and has no DType.
type Buffer struct {
	b  []byte
	dt DType
}

// F32 returns a Buffer over s.
func F32(s []float32) Buffer {
	return Buffer{b: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), dt: Float32}
}

// BF16 returns a Buffer over s, whose elements are bfloat16 bit patterns.
func BF16(s []uint16) Buffer { return Buffer{b: u16Bytes(s), dt: BFloat16} }

// F16 returns a Buffer over s, whose elements are IEEE binary16 bit patterns.
func F16(s []uint16) Buffer { return Buffer{b: u16Bytes(s), dt: Float16} }

func u16Bytes(s []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 2*len(s))
}

// NewBuffer allocates a zeroed Buffer of n elements of dt, 8-byte aligned.
func NewBuffer(dt DType, n int) Buffer {
	nb := n * dt.Size()
	words := make([]uint64, (nb+7)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), 8*len(words))
	return Buffer{b: b[:nb:nb], dt: dt}
}

// Len returns the number of elements.
func (b Buffer) Len() int {
	if s := b.dt.Size(); s > 0 {
		return len(b.b) / s
	}
	return 0
}

// DType returns the element type.
func (b Buffer) DType() DType { return b.dt }

// Bytes returns the buffer's memory as bytes, without copying.
func (b Buffer) Bytes() []byte { return b.b }

// Slice returns the elements [lo, hi) as a Buffer sharing b's memory.
func (b Buffer) Slice(lo, hi int) Buffer {
	s := b.dt.Size()
	return Buffer{b: b.b[lo*s : hi*s : hi*s], dt: b.dt}
}

// Float32s returns the elements of a Float32 buffer. It panics for other
// dtypes.
func (b Buffer) Float32s() []float32 {
	if b.dt != Float32 {
		panic("comm: Float32s of a " + b.dt.String() + " buffer")
	}
	return b.f32()
}

// Uint16s returns the bit patterns of a BFloat16 or Float16 buffer. It
// panics for other dtypes.
func (b Buffer) Uint16s() []uint16 {
	if b.dt != BFloat16 && b.dt != Float16 {
		panic("comm: Uint16s of a " + b.dt.String() + " buffer")
	}
	return b.u16()
}

func (b Buffer) f32() []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b.b))), len(b.b)/4)
}

func (b Buffer) u16() []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b.b))), len(b.b)/2)
}

// sameMem reports whether a and b are the same memory (in-place use).
func sameMem(a, b Buffer) bool {
	return len(a.b) == len(b.b) && (len(a.b) == 0 || &a.b[0] == &b.b[0])
}

// overlaps reports whether a and b share any byte.
func overlaps(a, b Buffer) bool {
	if len(a.b) == 0 || len(b.b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a.b[0])), uintptr(unsafe.Pointer(&b.b[0]))
	return pa < pb+uintptr(len(b.b)) && pb < pa+uintptr(len(a.b))
}

// copyInto copies src into dst unless they are the same memory.
func copyInto(dst, src Buffer) {
	if !sameMem(dst, src) {
		copy(dst.b, src.b)
	}
}

// ParseDType reads an element type as users spell it, in any case: float32
// (float, f32, fp32), bfloat16 (bf16) or float16 (half, f16, fp16); "" is
// float32. It is the one parser of every dtype gtrain takes (bench
// collectives --dtype, the job's precision and parallel.grad_dtype, ckpt
// export --dtype), so a spelling one accepts, all do.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "", "float32", "float", "f32", "fp32":
		return Float32, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float16", "half", "f16", "fp16":
		return Float16, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (want float32, bfloat16 or float16)", s)
}

// ParseOp reads a reduce op: sum, avg, max or min.
func ParseOp(s string) (Op, error) {
	for _, o := range []Op{Sum, Avg, Max, Min} {
		if s == o.String() {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown reduce op %q (want sum, avg, max or min)", s)
}
