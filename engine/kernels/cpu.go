package kernels

// simdLevel is an instruction set the package has kernels for. The tests
// and benchmarks run every level up to cpuLevel, the best this CPU runs;
// the package itself always uses cpuLevel.
type simdLevel uint8

const (
	levelGo     simdLevel = iota // portable Go
	levelAVX2                    // AVX2 and FMA: 16 256-bit registers
	levelAVX512                  // AVX-512 F: 32 512-bit registers
)

func (l simdLevel) String() string {
	switch l {
	case levelAVX2:
		return "avx2"
	case levelAVX512:
		return "avx512"
	}
	return "go"
}
