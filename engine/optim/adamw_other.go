//go:build !amd64 || purego

package optim

// useAVX2AdamW is false: the Go loop runs.
const useAVX2AdamW = false

// adamwAVX2 is never called where useAVX2AdamW is false.
func adamwAVX2(p, g, m, v []float32, k *adamwK) {}
