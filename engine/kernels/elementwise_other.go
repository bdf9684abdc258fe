//go:build !amd64 || purego

package kernels

// useAVX2Elem is false: the Go loops of elementwise.go run.
const useAVX2Elem = false

// The vector loops are never called where useAVX2Elem is false.

func geluArgAVX2(e, x []float32, k *[4]float32)                    {}
func geluOutAVX2(o, x, e []float32)                                {}
func geluGradOutAVX2(di, x, e, d []float32, k *[4]float32)         {}
func addF64AVX2(acc []float64, d []float32)                        {}
func addToAVX2(out, a, b []float32)                                {}
func lnOutAVX2(o, x, w, b []float32, m, s float32)                 {}
func lnGradOutAVX2(di, x, w, d []float32, k *[4]float32)           {}
func lnParamGradAVX2(dweight, dbias, d, x []float32, m, s float32) {}
func max32AVX2(x []float32, lanes *[8]float32)                     {}
func subScalarAVX2(x []float32, c float32)                         {}
func mulScalarAVX2(x []float32, c float32)                         {}
func softmaxGradAVX2(g, p []float32, dot float32)                  {}
