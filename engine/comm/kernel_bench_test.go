package comm

import (
	"fmt"
	"testing"
)

// The kernel benchmarks run each kernel at every level this machine has:
// the Go code alone ("go"), then "avx2" and "avx512" where the CPU has
// them (the package uses the best). The bytes per second they report are the bytes of the
// result (dst) for reductions and divisions, and of the float32 side for
// conversions; a reduction moves three times that (two reads, one write).
// On the development machine (48 KiB L1d and 1 MiB L2 per core, 32 MiB
// L3) 4 KiB runs in L1, 64 KiB in L2, 1 MiB in L2 and L3, and 16 MiB
// reductions (three buffers) mostly from memory; the single 16 MiB buffer
// of a division, and the 24 MiB of a conversion, still fit in L3.

var kernelBenchSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20}

// benchBuffer returns n elements of dt holding small ordinary numbers.
func benchBuffer(dt DType, n, seed int) Buffer {
	b := NewBuffer(dt, n)
	for i := range n {
		setF64(b, i, float64((i*seed)%101)/8-6)
	}
	return b
}

// benchLevels are the kernel levels to benchmark.
func benchLevels() []simdLevel {
	var ls []simdLevel
	for l := levelGo; l <= cpuLevel; l++ {
		ls = append(ls, l)
	}
	return ls
}

func BenchmarkKernelReduce(b *testing.B) {
	for _, dt := range kernelDTypes {
		for _, op := range []Op{Sum, Max, Min} {
			for _, size := range kernelBenchSizes {
				n := size / dt.Size()
				x, y, dst := benchBuffer(dt, n, 3), benchBuffer(dt, n, 7), NewBuffer(dt, n)
				for _, l := range benchLevels() {
					b.Run(fmt.Sprintf("%v/%v/%s/%v", dt, op, sizeName(size), l), func(b *testing.B) {
						b.SetBytes(int64(size))
						for b.Loop() {
							reduceAt(l, op, dst, x, y)
						}
					})
				}
			}
		}
	}
}

func BenchmarkKernelDivide(b *testing.B) {
	for _, dt := range kernelDTypes {
		for _, size := range kernelBenchSizes {
			buf := benchBuffer(dt, size/dt.Size(), 3)
			for _, l := range benchLevels() {
				b.Run(fmt.Sprintf("%v/%s/%v", dt, sizeName(size), l), func(b *testing.B) {
					b.SetBytes(int64(size))
					// Dividing by 1 keeps the values, and costs what any
					// other divisor does.
					for b.Loop() {
						divideAt(l, buf, 1)
					}
				})
			}
		}
	}
}

func BenchmarkKernelConvert(b *testing.B) {
	for _, size := range kernelBenchSizes {
		n := size / 4
		f := benchBuffer(Float32, n, 3).f32()
		h := make([]uint16, n)
		EncodeBF16(h, f)
		for _, tc := range []struct {
			name string
			run  func(l simdLevel)
		}{
			{"EncodeBF16", func(l simdLevel) { encodeAt(l, BFloat16, h, f) }},
			{"DecodeBF16", func(l simdLevel) { decodeAt(l, BFloat16, f, h) }},
			{"EncodeF16", func(l simdLevel) { encodeAt(l, Float16, h, f) }},
			{"DecodeF16", func(l simdLevel) { decodeAt(l, Float16, f, h) }},
		} {
			for _, l := range benchLevels() {
				b.Run(fmt.Sprintf("%s/%s/%v", tc.name, sizeName(size), l), func(b *testing.B) {
					b.SetBytes(int64(size))
					for b.Loop() {
						tc.run(l)
					}
				})
			}
		}
	}
}
