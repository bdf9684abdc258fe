//go:build !amd64 || purego

package kernels

// useAVX2Exp is false: there is no vector exponential on this platform.
const useAVX2Exp = false

// expInPlaceAVX2 is never called where useAVX2Exp is false.
func expInPlaceAVX2(x []float32) { expInPlaceGo(x) }
