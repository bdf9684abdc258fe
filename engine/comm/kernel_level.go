package comm

// simdLevel is the instruction set the element kernels (reductions,
// division, 16-bit conversions) use. Every SIMD kernel works on the
// longest prefix that is a whole number of its blocks and returns that
// length; the Go code does the rest, and is the reference the kernels
// match bit for bit, NaN payloads included (kernel_test.go).
type simdLevel uint8

const (
	levelGo     simdLevel = iota // the Go code only
	levelAVX2                    // AVX2 and F16C: 256-bit registers
	levelAVX512                  // AVX-512 F and BW: 512-bit registers
)

func (l simdLevel) String() string {
	switch l {
	case levelAVX2:
		return "avx2"
	case levelAVX512:
		return "avx512"
	}
	return "go"
}

// block is the number of elements l's kernels work in.
func (l simdLevel) block() int {
	switch l {
	case levelAVX2:
		return 16
	case levelAVX512:
		return 32
	}
	return 1
}

// kernelOp is the index of op's kernel in the kernel tables: Avg reduces
// as Sum (the division comes once, at the end), -1 for no kernel.
func kernelOp(op Op) int {
	switch op {
	case Sum, Avg:
		return 0
	case Max:
		return 1
	case Min:
		return 2
	}
	return -1
}
