//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// cpuLevel is the best level this CPU runs. AVX-512 needs only F (the
// matrix kernels use nothing else, and x/sys/cpu reports it only when the
// OS saves the 512-bit registers). Unlike engine/comm's element kernels,
// which are memory-bound and ask for VBMI2 to avoid the Skylake-X clock
// penalty, a compute-bound multiply gains more from the doubled width than
// it loses to the lower clock: OpenBLAS and BLIS use 512-bit kernels on
// Skylake-X too (not measured here: no such machine).
var cpuLevel = func() simdLevel {
	x := &cpu.X86
	switch {
	case x.HasAVX512F:
		return levelAVX512
	case x.HasAVX2 && x.HasFMA:
		return levelAVX2
	}
	return levelGo
}()
