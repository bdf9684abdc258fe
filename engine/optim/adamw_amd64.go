//go:build amd64 && !purego

package optim

import "golang.org/x/sys/cpu"

// useAVX2AdamW selects the eight-lane update (adamw_amd64.s): AVX2 alone,
// no fused multiply-adds, so it rounds as the Go loop does. Under -race
// the Go loop runs, so that the race detector sees the optimizer's writes.
var useAVX2AdamW = cpu.X86.HasAVX2 && !raceEnabled

// adamwAVX2 is adamwGo for len(p) a multiple of 8.
//
//go:noescape
func adamwAVX2(p, g, m, v []float32, k *adamwK)
