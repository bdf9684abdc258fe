//go:build linux && amd64 && !purego

package comm

import "testing"

// BenchmarkSHMAllReduceRingCopy runs the direct all-reduce of 2 goroutine
// ranks over shared memory with the rings copied by Go's copy and by
// ringCopy's REP MOVSB, side by side. -count repeats each variant in a
// row, so run the benchmark in a shell loop to interleave them. Two
// goroutines of one process share the Go scheduler and are noisy on a
// loaded machine; the figures the change was made for are those of two
// processes (docs/benchmarks.md).
func BenchmarkSHMAllReduceRingCopy(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20, 4 << 20} {
		for _, rep := range []bool{false, true} {
			name := tpSizeName(size) + map[bool]string{false: "/copy=go", true: "/copy=rep"}[rep]
			b.Run(name, func(b *testing.B) {
				if rep && !ringCopyRep {
					b.Skip("no ERMS on this CPU")
				}
				defer func(old bool) { ringCopyRep = old }(ringCopyRep)
				ringCopyRep = rep
				benchAllReduce(b, shmBenchWorld(b, 2, 0, 0), size)
			})
		}
	}
}
