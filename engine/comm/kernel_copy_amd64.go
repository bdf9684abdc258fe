//go:build amd64 && !purego

package comm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyRepMovsb(dst, src *byte, n int)

// ringCopyMin is the shortest copy ringCopy hands to REP MOVSB: below it
// the instruction's start-up costs more than it saves.
const ringCopyMin = 4 << 10

// ringCopyRep is whether ringCopy uses REP MOVSB: where the CPU says its
// string moves are fast (ERMS).
var ringCopyRep = cpu.X86.HasERMS

// ringCopy is copy(dst, src) for bytes going into or out of a
// shared-memory ring. A ring's cache lines were last read by the peer's
// core, and a buffer's are cold at these sizes: Go's copy stores 32 bytes
// at a time and first reads each line in for ownership, while a fast string
// move (ERMS) writes whole lines without reading them. On this package's
// development machine (AMD EPYC, 2 ranks in 2 processes) the ring writes
// of a 1 and a 4 MiB all-reduce went from 130 to 105 µs and from 530 to 430
// (medians of 400, same minute, load 7), and the best time of the
// all-reduce fell 5-15% from 64 KiB to 8 MiB (docs/benchmarks.md). dst
// and src must not overlap.
func ringCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < ringCopyMin || !ringCopyRep {
		return copy(dst, src)
	}
	raceConvert(unsafe.Pointer(&dst[0]), n, unsafe.Pointer(&src[0]), n)
	copyRepMovsb(&dst[0], &src[0], n)
	return n
}
