//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// useAVX2Exp selects the vector exponential: eight lanes with fused
// multiply-adds, about nine times the scalar loop's speed
// (BenchmarkExpInPlace). Its results differ from the scalar loop's in the
// last bit now and then (the fused operations round once), within the same
// 2-ulp bound.
var useAVX2Exp = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// expAVX2 is expInPlace for len(x) a multiple of 8, in exp_amd64.s.
//
//go:noescape
func expAVX2(x []float32)

// expInPlaceAVX2 is expInPlace on AVX2. The tail shorter than eight goes
// through a padded copy rather than the scalar loop, so that every element
// is rounded the same way wherever a caller's slice happens to end (the
// kernels split rows and ranges among goroutines, and their results must
// not depend on the split).
func expInPlaceAVX2(x []float32) {
	n := len(x) &^ 7
	if n > 0 {
		expAVX2(x[:n])
	}
	if n < len(x) {
		var buf [8]float32
		t := copy(buf[:], x[n:])
		expAVX2(buf[:])
		copy(x[n:], buf[:t])
	}
}
