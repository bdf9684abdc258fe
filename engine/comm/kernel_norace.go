//go:build !race

package comm

import "unsafe"

const raceEnabled = false

// Without -race the kernel wrappers' reports to the race detector compile
// away.

func raceReduce(dst, a, b unsafe.Pointer, n int)                         {}
func raceUpdate(p unsafe.Pointer, n int)                                 {}
func raceConvert(dst unsafe.Pointer, dn int, src unsafe.Pointer, sn int) {}
