package comm

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The SIMD kernels must give bitwise the results of the Go code (the
// *Generic functions and the Go loops they call), NaN payloads and -0
// included. Each test runs every kernel level this machine has (the *At
// helpers: the level's kernel on the whole blocks, the Go code on the
// tail) against the Go code alone. Built with -tags purego, or on another
// architecture, there are no kernels and the tests skip.

// simdLevels returns the SIMD levels this machine runs, skipping the test
// if there are none.
func simdLevels(t *testing.T) []simdLevel {
	t.Helper()
	var ls []simdLevel
	for l := levelGo + 1; l <= cpuLevel; l++ {
		ls = append(ls, l)
	}
	if len(ls) == 0 {
		t.Skip("no SIMD kernels in this build or on this CPU")
	}
	return ls
}

func reduceAt(l simdLevel, op Op, dst, a, b Buffer) {
	if dst.dt == Float32 {
		d, x, y := dst.f32(), a.f32(), b.f32()
		i := reduceF32SIMD(l, op, d, x, y)
		reduceF32Generic(op, d[i:], x[i:], y[i:])
		return
	}
	d, x, y := dst.u16(), a.u16(), b.u16()
	if i := reduceHalfSIMD(l, dst.dt, op, d, x, y); i < len(d) {
		reduceHalfGeneric(dst.dt, op, d[i:], x[i:], y[i:])
	}
}

func divideAt(l simdLevel, buf Buffer, p int) {
	if buf.dt == Float32 {
		f := buf.f32()
		i := divF32SIMD(l, f, float32(p))
		divF32(f[i:], float32(p))
		return
	}
	u := buf.u16()
	if i := divHalfSIMD(l, buf.dt, u, float32(p)); i < len(u) {
		divHalfGeneric(buf.dt, u[i:], float32(p))
	}
}

func encodeAt(l simdLevel, dt DType, dst []uint16, src []float32) {
	i := encodeSIMD(l, dt, dst, src)
	encodeHalfGeneric(dt, dst[i:], src[i:])
}

func decodeAt(l simdLevel, dt DType, dst []float32, src []uint16) {
	i := decodeSIMD(l, dt, dst, src)
	decodeHalfGeneric(dt, dst[i:], src[i:])
}

// TestKernelDispatch checks that the package's entry points use the best
// level (whose results the other tests check).
func TestKernelDispatch(t *testing.T) {
	t.Logf("kernel level %v, block %d elements", cpuLevel, cpuLevel.block())
	rng := rand.New(rand.NewPCG(9, 10))
	for _, dt := range kernelDTypes {
		a, b := NewBuffer(dt, 1000), NewBuffer(dt, 1000)
		fillRandom(rng, a)
		fillRandom(rng, b)
		got, want := NewBuffer(dt, 1000), NewBuffer(dt, 1000)
		reduceInto(Max, got, a, b)
		reduceAt(cpuLevel, Max, want, a, b)
		if !bytes.Equal(got.b, want.b) {
			t.Errorf("%v: reduceInto differs from level %v", dt, cpuLevel)
		}
	}
}

// kernelCases are the lengths and slice offsets (in elements, so starts
// that are not 32-byte aligned) the kernels are checked on: every length
// up to 70, so every tail with and without whole blocks, and large odd ones.
func kernelCases() (lengths, offsets []int) {
	for n := range 71 {
		lengths = append(lengths, n)
	}
	return append(lengths, 1001, 4097, 16411), []int{0, 1, 3, 7}
}

var kernelDTypes = []DType{Float32, BFloat16, Float16}

// specialF32 are float32 bit patterns at the edges: zeros, the smallest and
// largest subnormals and normals, Infs, quiet and signalling NaNs with
// payloads high and low, of both signs.
var specialF32 = []uint32{
	0x00000000, 0x00000001, 0x007fffff, 0x00800000, 0x3f800000, 0x3f808000,
	0x3f818000, 0x477fe000, 0x477ff000, 0x47800000, 0x38800000, 0x33800000,
	0x7f7f7fff, 0x7f7fffff, 0x7f800000, 0x7f800001, 0x7f802000, 0x7fbfffff,
	0x7fc00000, 0x7fc00001, 0x7fffe000, 0x7fffffff,
}

// specialHalf are 16-bit patterns at the edges, valid as both bfloat16 and
// float16 (for one or the other they are just other numbers).
var specialHalf = []uint16{
	0x0000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x3f80, 0x3f81, 0x7bff,
	0x7c00, 0x7c01, 0x7d00, 0x7dff, 0x7e00, 0x7e01, 0x7f7f, 0x7f80, 0x7f81,
	0x7fbf, 0x7fc0, 0x7fc1, 0x7fff,
}

// fillRandom fills buf with random elements: raw random bits (every class,
// NaN payloads included), special values, and ordinary numbers, so sums
// round, overflow and cancel.
func fillRandom(rng *rand.Rand, buf Buffer) {
	if buf.dt == Float32 {
		f := buf.f32()
		for i := range f {
			var b uint32
			switch rng.IntN(4) {
			case 0:
				b = rng.Uint32()
			case 1:
				b = specialF32[rng.IntN(len(specialF32))] | rng.Uint32()&0x80000000
			case 2:
				b = math.Float32bits(float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(60)-30))))
			default:
				b = math.Float32bits(float32(rng.IntN(9) - 4))
			}
			f[i] = math.Float32frombits(b)
		}
		return
	}
	u := buf.u16()
	for i := range u {
		switch rng.IntN(3) {
		case 0:
			u[i] = uint16(rng.Uint32())
		case 1:
			u[i] = specialHalf[rng.IntN(len(specialHalf))] | uint16(rng.Uint32())&0x8000
		default:
			u[i] = encodeOne(buf.dt, float32(rng.NormFloat64()*math.Exp2(float64(rng.IntN(20)-10))))
		}
	}
}

func encodeOne(dt DType, f float32) uint16 {
	if dt == BFloat16 {
		return BF16FromFloat32(f)
	}
	return F16FromFloat32(f)
}

// relate makes some elements of b equal to a's or to their negation: the
// ties of Max and Min (±0 among them) and exact cancellation in Sum.
func relate(rng *rand.Rand, a, b Buffer) {
	s := a.dt.Size()
	sign := byte(0x80)
	for i := range a.Len() {
		switch rng.IntN(8) {
		case 0:
			copy(b.b[i*s:(i+1)*s], a.b[i*s:(i+1)*s])
		case 1:
			copy(b.b[i*s:(i+1)*s], a.b[i*s:(i+1)*s])
			b.b[(i+1)*s-1] ^= sign
		}
	}
}

// offsetBuffer returns a Buffer of n elements starting off elements into a
// fresh allocation.
func offsetBuffer(dt DType, n, off int) Buffer {
	return NewBuffer(dt, n+off).Slice(off, off+n)
}

func cloneBuffer(b Buffer) Buffer {
	c := NewBuffer(b.dt, b.Len())
	copy(c.b, b.b)
	return c
}

func reduceGeneric(op Op, dst, a, b Buffer) {
	if dst.dt == Float32 {
		reduceF32Generic(op, dst.f32(), a.f32(), b.f32())
	} else {
		reduceHalfGeneric(dst.dt, op, dst.u16(), a.u16(), b.u16())
	}
}

// firstDiff describes the first element where got and want differ.
func firstDiff(got, want Buffer) string {
	s := got.dt.Size()
	for i := range got.Len() {
		if g, w := got.b[i*s:(i+1)*s], want.b[i*s:(i+1)*s]; !bytes.Equal(g, w) {
			return fmt.Sprintf("element %d: got %s, want %s", i, elemBits(got, i), elemBits(want, i))
		}
	}
	return "no difference"
}

func elemBits(b Buffer, i int) string {
	if b.dt == Float32 {
		return fmt.Sprintf("%#08x", math.Float32bits(b.f32()[i]))
	}
	return fmt.Sprintf("%#04x", b.u16()[i])
}

func TestKernelReduce(t *testing.T) {
	levels := simdLevels(t)
	rng := rand.New(rand.NewPCG(11, 12))
	lengths, offsets := kernelCases()
	for _, dt := range kernelDTypes {
		for _, op := range []Op{Sum, Max, Min} {
			t.Run(fmt.Sprintf("%v/%v", dt, op), func(t *testing.T) {
				for _, n := range lengths {
					for _, off := range offsets {
						checkReduce(t, levels, rng, op, dt, n, off)
					}
				}
			})
		}
	}
}

// checkReduce reduces random operands of n elements, off elements into
// their allocations (and dst at yet another offset, or dst being a or b),
// at every level.
func checkReduce(t *testing.T, levels []simdLevel, rng *rand.Rand, op Op, dt DType, n, off int) {
	t.Helper()
	a, b := NewBuffer(dt, n), NewBuffer(dt, n)
	fillRandom(rng, a)
	fillRandom(rng, b)
	relate(rng, a, b)
	want := NewBuffer(dt, n)
	reduceGeneric(op, want, a, b)
	for _, l := range levels {
		for _, alias := range []string{"none", "dst=a", "dst=b"} {
			x, y := offsetBuffer(dt, n, off), offsetBuffer(dt, n, (off+5)%8)
			copy(x.b, a.b)
			copy(y.b, b.b)
			dst := offsetBuffer(dt, n, (off+2)%8)
			switch alias {
			case "dst=a":
				dst = x
			case "dst=b":
				dst = y
			}
			reduceAt(l, op, dst, x, y)
			if !bytes.Equal(dst.b, want.b) {
				t.Fatalf("%v: n %d, offset %d, %s: %s", l, n, off, alias, firstDiff(dst, want))
			}
		}
	}
}

// TestKernelHalfReduceSweep reduces every 16-bit value with each of a set
// of others (every special value and random ones), on either side.
func TestKernelHalfReduceSweep(t *testing.T) {
	levels := simdLevels(t)
	rng := rand.New(rand.NewPCG(13, 14))
	others := append([]uint16(nil), specialHalf...)
	for _, h := range specialHalf {
		others = append(others, h|0x8000)
	}
	for range 16 {
		others = append(others, uint16(rng.Uint32()))
	}
	if raceEnabled {
		// The Go reference runs some ten times slower under -race: keep
		// zeros, Infs, NaNs and the largest finite values.
		others = []uint16{0x0000, 0x8000, 0x7c00, 0xfc00, 0x7f80, 0xff80, 0x7c01, 0xfe01, 0x7f81, 0xffc1, 0x7bff, 0x7f7f}
	}
	for _, dt := range []DType{BFloat16, Float16} {
		all, other := NewBuffer(dt, 1<<16), NewBuffer(dt, 1<<16)
		for i, u := 0, all.u16(); i < len(u); i++ {
			u[i] = uint16(i)
		}
		for _, op := range []Op{Sum, Max, Min} {
			t.Run(fmt.Sprintf("%v/%v", dt, op), func(t *testing.T) {
				got, want := NewBuffer(dt, 1<<16), NewBuffer(dt, 1<<16)
				for _, h := range others {
					for i, u := 0, other.u16(); i < len(u); i++ {
						u[i] = h
					}
					for _, pair := range [][2]Buffer{{all, other}, {other, all}} {
						reduceGeneric(op, want, pair[0], pair[1])
						for _, l := range levels {
							reduceAt(l, op, got, pair[0], pair[1])
							if i := firstDiffIndex(got, want); i >= 0 {
								t.Fatalf("%v: %#04x %v %#04x = %s, want %s", l, pair[0].u16()[i], op, pair[1].u16()[i], elemBits(got, i), elemBits(want, i))
							}
						}
					}
				}
			})
		}
	}
}

func firstDiffIndex(got, want Buffer) int {
	s := got.dt.Size()
	for i := range got.Len() {
		if !bytes.Equal(got.b[i*s:(i+1)*s], want.b[i*s:(i+1)*s]) {
			return i
		}
	}
	return -1
}

func TestKernelDivide(t *testing.T) {
	levels := simdLevels(t)
	rng := rand.New(rand.NewPCG(15, 16))
	lengths, offsets := kernelCases()
	for _, dt := range kernelDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			check := func(in Buffer, off, p int) {
				t.Helper()
				want := cloneBuffer(in)
				divideGeneric(want, p)
				for _, l := range levels {
					got := offsetBuffer(dt, in.Len(), off)
					copy(got.b, in.b)
					divideAt(l, got, p)
					if !bytes.Equal(got.b, want.b) {
						t.Fatalf("%v: n %d, offset %d, divide by %d: %s", l, in.Len(), off, p, firstDiff(got, want))
					}
				}
			}
			for _, n := range lengths {
				for _, off := range offsets {
					in := NewBuffer(dt, n)
					fillRandom(rng, in)
					check(in, off, []int{1, 2, 3, 7, 8, 1000}[rng.IntN(6)])
				}
			}
			if dt == Float32 {
				return
			}
			all := NewBuffer(dt, 1<<16) // every 16-bit value
			for i, u := 0, all.u16(); i < len(u); i++ {
				u[i] = uint16(i)
			}
			for _, p := range []int{2, 3, 5, 6, 7, 24} {
				check(all, 0, p)
			}
		})
	}
}

func divideGeneric(buf Buffer, n int) {
	if buf.dt == Float32 {
		divF32(buf.f32(), float32(n))
	} else {
		divHalfGeneric(buf.dt, buf.u16(), float32(n))
	}
}

// TestKernelDecode widens every 16-bit value, at every offset, and every
// length up to 70 (through the NaNs).
func TestKernelDecode(t *testing.T) {
	levels := simdLevels(t)
	src := make([]uint16, 1<<16+7)
	for i := range src {
		src[i] = uint16(i)
	}
	for _, dt := range []DType{BFloat16, Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			check := func(src []uint16) {
				t.Helper()
				got, want := make([]float32, len(src)), make([]float32, len(src))
				decodeHalfGeneric(dt, want, src)
				for _, l := range levels {
					decodeAt(l, dt, got, src)
					if i := firstDiffIndex(F32(got), F32(want)); i >= 0 {
						t.Fatalf("%v: len %d: %#04x widened to %#08x, want %#08x", l, len(src), src[i], math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
			for off := range 8 {
				check(src[off : off+1<<16-7])
			}
			for n := range 71 {
				for off := range 4 {
					check(src[0x7bf0+off : 0x7bf0+off+n])
				}
			}
		})
	}
}

// encodeSweep returns float32 values that take every rounding path to both
// 16-bit formats: every combination of sign, exponent and top seven
// mantissa bits, each with low halves that put every bit position on,
// just below and just above a rounding boundary (for float16 subnormals
// the boundary moves with the exponent), ties with odd and even kept bits,
// and NaNs of every kind; then random patterns.
func encodeSweep(rng *rand.Rand) []float32 {
	lows := []uint32{0, 0xffff}
	for k := range 17 {
		for _, l := range []uint32{1<<k - 1, 1 << k, 1<<k + 1} {
			lows = append(lows, l&0xffff, (l|1<<13)&0xffff)
		}
	}
	out := make([]float32, 0, 1<<16*len(lows)+1<<20)
	for hi := range uint32(1 << 16) {
		for _, l := range lows {
			out = append(out, math.Float32frombits(hi<<16|l))
		}
	}
	for range 1 << 20 {
		out = append(out, math.Float32frombits(rng.Uint32()))
	}
	return out
}

func TestKernelEncode(t *testing.T) {
	levels := simdLevels(t)
	rng := rand.New(rand.NewPCG(17, 18))
	sweep := encodeSweep(rng)
	lengths, offsets := kernelCases()
	for _, dt := range []DType{BFloat16, Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			check := func(src []float32) {
				t.Helper()
				got, want := make([]uint16, len(src)), make([]uint16, len(src))
				encodeHalfGeneric(dt, want, src)
				for _, l := range levels {
					encodeAt(l, dt, got, src)
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("%v: len %d: %#08x rounded to %#04x, want %#04x", l, len(src), math.Float32bits(src[i]), got[i], want[i])
						}
					}
				}
			}
			check(sweep)
			for _, n := range lengths {
				for _, off := range offsets {
					src := make([]float32, n+off)
					fillRandom(rng, F32(src))
					check(src[off:])
				}
			}
		})
	}
}

// TestRingCopy checks ringCopy against copy on both sides of ringCopyMin,
// at every misalignment of either side: the bytes copied, the count
// returned, and that nothing around dst changes.
func TestRingCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 300<<10)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	buf := make([]byte, len(src)+128)
	for _, n := range []int{0, 1, 63, ringCopyMin - 1, ringCopyMin, ringCopyMin + 1, 64<<10 + 13, 256 << 10} {
		for _, off := range []int{0, 1, 7, 32} {
			for _, soff := range []int{0, 3, 64} {
				for i := range buf {
					buf[i] = 0xa5
				}
				dst := buf[off : off+n]
				if got := ringCopy(dst, src[soff:soff+n]); got != n {
					t.Fatalf("n %d: ringCopy returned %d", n, got)
				}
				if !bytes.Equal(dst, src[soff:soff+n]) {
					t.Fatalf("n %d dst+%d src+%d: bytes differ", n, off, soff)
				}
				if bytes.Count(buf[:off], []byte{0xa5}) != off || bytes.Count(buf[off+n:], []byte{0xa5}) != len(buf)-off-n {
					t.Fatalf("n %d dst+%d src+%d: wrote outside dst", n, off, soff)
				}
			}
		}
	}
	// A shorter side bounds the copy, as with copy.
	short := make([]byte, ringCopyMin+5)
	if got := ringCopy(short, src); got != len(short) || !bytes.Equal(short, src[:len(short)]) {
		t.Fatalf("into a shorter dst: returned %d", got)
	}
	if got := ringCopy(buf, src[:ringCopyMin+9]); got != ringCopyMin+9 || !bytes.Equal(buf[:got], src[:got]) {
		t.Fatalf("from a shorter src: returned %d", got)
	}
}
