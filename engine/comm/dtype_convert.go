package comm

import "math"

// Conversions between float32 and the 16-bit float formats. Rounding is to
// nearest, ties to even (IEEE 754 roundTiesToEven); NaN stays NaN (made
// quiet, sign and top payload bits kept); a finite value too large for the
// format rounds to ±Inf, as IEEE requires. bfloat16 has float32's exponent
// range, so every float32 (subnormals included) rounds like any other value;
// float16 values below 2^-14 become float16 subnormals, and below 2^-25 zero.

// BF16FromFloat32 rounds f to the nearest bfloat16, ties to even.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: truncating could make it Inf
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds the dropped half to
	// nearest-even; a carry propagates into the exponent (up to Inf).
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BF16ToFloat32 returns the bfloat16 h as a float32 (exact).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromFloat32 rounds f to the nearest IEEE binary16, ties to even.
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if e := b >> 23 & 0xff; e-113 < 30 { // a normal float16 (or rounds up to Inf)
		a := b&0x7fffffff - 112<<23 // rebias the exponent from 127 to 15
		return uint16(b>>16)&0x8000 | uint16((a+0xfff+(a>>13)&1)>>13)
	}
	return f16FromBitsSlow(b)
}

// f16FromBitsSlow handles NaN, Inf, overflow, float16 subnormals and zero.
func f16FromBitsSlow(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	e := b >> 23 & 0xff
	man := b & 0x7fffff
	switch {
	case e == 0xff && man != 0:
		return sign | 0x7e00 | uint16(man>>13)
	case e >= 143: // Inf, or |f| >= 2^16
		return sign | 0x7c00
	case e < 102: // |f| < 2^-25, half the smallest subnormal
		return sign
	}
	// |f| in [2^-25, 2^-14): a subnormal, in units of 2^-24.
	m := man | 0x800000
	shift := 126 - e
	r := m >> shift
	rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
	if rem > half || rem == half && r&1 == 1 {
		r++ // may become 0x400, the smallest normal: still the right encoding
	}
	return sign | uint16(r)
}

// F16ToFloat32 returns the IEEE binary16 h as a float32 (exact).
func F16ToFloat32(h uint16) float32 {
	if e := h >> 10 & 0x1f; e-1 < 30 { // normal
		return math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)<<13 + 112<<23))
	}
	return f16ToF32Slow(h)
}

// f16ToF32Slow handles Inf, NaN, subnormals and zero.
func f16ToF32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	man := uint32(h & 0x3ff)
	if h&0x7c00 == 0x7c00 { // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	f := float32(man) * (1.0 / (1 << 24)) // subnormal or zero: exact
	return math.Float32frombits(math.Float32bits(f) | sign)
}

// EncodeBF16 rounds src into dst (len(dst) >= len(src)) as bfloat16.
func EncodeBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	i := encodeSIMD(cpuLevel, BFloat16, dst, src)
	encodeBF16Generic(dst[i:], src[i:])
}

// DecodeBF16 widens the bfloat16 src into dst (len(dst) >= len(src)).
func DecodeBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := decodeSIMD(cpuLevel, BFloat16, dst, src)
	decodeBF16Generic(dst[i:], src[i:])
}

// EncodeF16 rounds src into dst (len(dst) >= len(src)) as IEEE binary16.
func EncodeF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	i := encodeSIMD(cpuLevel, Float16, dst, src)
	encodeF16Generic(dst[i:], src[i:])
}

// DecodeF16 widens the IEEE binary16 src into dst (len(dst) >= len(src)).
func DecodeF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := decodeSIMD(cpuLevel, Float16, dst, src)
	decodeF16Generic(dst[i:], src[i:])
}

// The Go forms of the slice conversions: what runs without the SIMD
// kernels, on their tails, and the reference they are tested against.

// encodeBF16Generic is unrolled four ways: about 20% faster than the plain
// loop.
func encodeBF16Generic(dst []uint16, src []float32) {
	n := len(src)
	dst = dst[:n]
	i := 0
	for ; i <= n-4; i += 4 {
		d, s := (*[4]uint16)(dst[i:]), (*[4]float32)(src[i:])
		d[0], d[1], d[2], d[3] = BF16FromFloat32(s[0]), BF16FromFloat32(s[1]), BF16FromFloat32(s[2]), BF16FromFloat32(s[3])
	}
	for ; i < n; i++ {
		dst[i] = BF16FromFloat32(src[i])
	}
}

func decodeBF16Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = BF16ToFloat32(h)
	}
}

// encodeF16Generic inlines the common case (a normal result); the rest
// takes a call.
func encodeF16Generic(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		b := math.Float32bits(f)
		if e := b >> 23 & 0xff; e-113 < 30 {
			a := b&0x7fffffff - 112<<23
			dst[i] = uint16(b>>16)&0x8000 | uint16((a+0xfff+(a>>13)&1)>>13)
		} else {
			dst[i] = f16FromBitsSlow(b)
		}
	}
}

func decodeF16Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		if e := h >> 10 & 0x1f; e-1 < 30 {
			dst[i] = math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)<<13 + 112<<23))
		} else {
			dst[i] = f16ToF32Slow(h)
		}
	}
}
