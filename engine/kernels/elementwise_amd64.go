//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// useAVX2Elem selects the vector element-wise loops of elementwise.go
// (AVX2 alone: they neither fuse nor need the 512-bit registers, and are
// mostly memory bound). Under -race the Go loops run instead, so that the
// race detector sees every access of the callers' slices (it does not see
// the assembly's).
var useAVX2Elem = cpu.X86.HasAVX2 && !raceEnabled

// The assembly loops take lengths that are a multiple of 8 (the callers
// do the tails in Go) and the other slices at least as long as the first
// input.

//go:noescape
func geluArgAVX2(e, x []float32, k *[4]float32)

//go:noescape
func geluOutAVX2(o, x, e []float32)

//go:noescape
func geluGradOutAVX2(di, x, e, d []float32, k *[4]float32)

//go:noescape
func addF64AVX2(acc []float64, d []float32)

//go:noescape
func addToAVX2(out, a, b []float32)

//go:noescape
func lnOutAVX2(o, x, w, b []float32, m, s float32)

// lnGradOutAVX2 reads m, s, gMean and gxMean from k.
//
//go:noescape
func lnGradOutAVX2(di, x, w, d []float32, k *[4]float32)

//go:noescape
func lnParamGradAVX2(dweight, dbias, d, x []float32, m, s float32)

// max32AVX2 leaves in lanes the maxima of 8 lanes of x (len(x) a multiple
// of 32), each starting from x[0]; like max32's Go loop a lane keeps its
// maximum on a tie or a NaN.
//
//go:noescape
func max32AVX2(x []float32, lanes *[8]float32)

//go:noescape
func subScalarAVX2(x []float32, c float32)

//go:noescape
func mulScalarAVX2(x []float32, c float32)

//go:noescape
func softmaxGradAVX2(g, p []float32, dot float32)
