//go:build race

package comm

import (
	"runtime"
	"unsafe"
)

// raceEnabled reports a -race build; the kernel tests sweep less under it.
const raceEnabled = true

// The race detector does not see the memory assembly reads and writes, so
// the kernel wrappers tell it.

func raceReduce(dst, a, b unsafe.Pointer, n int) {
	runtime.RaceReadRange(a, n)
	runtime.RaceReadRange(b, n)
	runtime.RaceWriteRange(dst, n)
}

func raceUpdate(p unsafe.Pointer, n int) {
	runtime.RaceReadRange(p, n)
	runtime.RaceWriteRange(p, n)
}

func raceConvert(dst unsafe.Pointer, dn int, src unsafe.Pointer, sn int) {
	runtime.RaceReadRange(src, sn)
	runtime.RaceWriteRange(dst, dn)
}
