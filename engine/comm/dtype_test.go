package comm

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestBF16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := BF16ToFloat32(uint16(h))
		got := BF16FromFloat32(f)
		if f != f {
			if g := BF16ToFloat32(got); g == g || got&0x40 == 0 || got&0x8000 != uint16(h)&0x8000 {
				t.Fatalf("NaN %#04x became %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("%#04x → %v → %#04x", h, f, got)
		}
	}
}

func TestBF16Rounding(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   uint32 // float32 bits
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"below half", 0x3f807fff, 0x3f80},
		{"tie to even (down)", 0x3f808000, 0x3f80},
		{"tie to even (up)", 0x3f818000, 0x3f82},
		{"above half", 0x3f808001, 0x3f81},
		{"negative zero", 0x80000000, 0x8000},
		{"max float32 overflows to Inf", 0x7f7fffff, 0x7f80},
		{"largest that stays finite", 0x7f7f7fff, 0x7f7f},
		{"-Inf", 0xff800000, 0xff80},
		{"quiet NaN", 0x7fc00000, 0x7fc0},
		{"NaN with low payload only", 0x7f800001, 0x7fc0},
		{"subnormal", 0x00018000, 0x0002},
		{"smallest subnormal rounds to zero", 0x00000001, 0x0000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BF16FromFloat32(math.Float32frombits(tc.in)); got != tc.want {
				t.Errorf("BF16FromFloat32(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := rng.Uint32()
		f := math.Float32frombits(b)
		if f != f {
			continue
		}
		if got, want := BF16FromFloat32(f), refBF16(f); got != want {
			t.Fatalf("BF16FromFloat32(%#08x) = %#04x, want %#04x", b, got, want)
		}
	}
}

// refBF16 rounds f to bfloat16 by comparing distances in float64.
func refBF16(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16) // truncated toward zero
	if uint32(lo)<<16 == b {
		return lo
	}
	hi := lo + 1 // next away from zero (0x7f80 is Inf: treat it as 2^128)
	a := math.Abs(float64(f))
	vlo, vhi := math.Abs(float64(BF16ToFloat32(lo))), math.Abs(float64(BF16ToFloat32(hi)))
	if hi&0x7fff == 0x7f80 {
		vhi = 0x1p128
	}
	switch dlo, dhi := a-vlo, vhi-a; {
	case dlo < dhi, dlo == dhi && lo&1 == 0:
		return lo
	}
	return hi
}

// refF16Value decodes binary16 from its definition.
func refF16Value(h uint16) float64 {
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	v := 0.0
	switch e {
	case 0:
		v = math.Ldexp(m, -24)
	case 0x1f:
		v = math.Inf(1)
		if m != 0 {
			v = math.NaN()
		}
	default:
		v = math.Ldexp(1+m/1024, e-15)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

// refF16 rounds f to binary16: the nearest finite value, ties to the even
// encoding, Inf from 65520 (half an ulp above the largest finite) up.
func refF16(f float32) uint16 {
	a := math.Abs(float64(f))
	sign := uint16(math.Float32bits(f)>>16) & 0x8000
	if a >= 65520 {
		return sign | 0x7c00
	}
	lo := uint16(sort.Search(0x7c00, func(h int) bool { return refF16Value(uint16(h)) > a }) - 1)
	if lo == 0x7bff || refF16Value(lo) == a {
		return sign | lo
	}
	dlo, dhi := a-refF16Value(lo), refF16Value(lo+1)-a
	if dlo < dhi || dlo == dhi && lo&1 == 0 {
		return sign | lo
	}
	return sign | (lo + 1)
}

func TestF16Decode(t *testing.T) {
	for h := range 1 << 16 {
		got, want := float64(F16ToFloat32(uint16(h))), refF16Value(uint16(h))
		if got != want && !(got != got && want != want) || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("F16ToFloat32(%#04x) = %v, want %v", h, got, want)
		}
	}
}

func TestF16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToFloat32(uint16(h))
		got := F16FromFloat32(f)
		if f != f {
			if got&0x7c00 != 0x7c00 || got&0x200 == 0 {
				t.Fatalf("NaN %#04x became %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("%#04x → %v → %#04x", h, f, got)
		}
	}
}

func TestF16Rounding(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"tie to even (down)", 1 + 0x1p-11, 0x3c00},
		{"tie to even (up)", 1 + 3*0x1p-11, 0x3c02},
		{"largest finite", 65504, 0x7bff},
		{"just below the Inf threshold", 65519.996, 0x7bff},
		{"the Inf threshold", 65520, 0x7c00},
		{"smallest normal", 0x1p-14, 0x0400},
		{"largest subnormal rounds up to normal", 0x1p-14 - 0x1p-26, 0x0400},
		{"smallest subnormal", 0x1p-24, 0x0001},
		{"half the smallest subnormal: tie to zero", 0x1p-25, 0x0000},
		{"just above half the smallest subnormal", 0x1p-25 + 0x1p-40, 0x0001},
		{"1.5 subnormal units: tie to even", 3 * 0x1p-25, 0x0002},
		{"negative subnormal", -5 * 0x1p-24, 0x8005},
		{"float32 subnormal", 0x1p-140, 0x0000},
		{"-Inf", float32(math.Inf(-1)), 0xfc00},
		{"NaN", float32(math.NaN()), 0x7e00},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := F16FromFloat32(tc.in); got != tc.want {
				t.Errorf("F16FromFloat32(%v) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		// Exponents around binary16's range, where all the cases are.
		b := rng.Uint32()&0x807fffff | (95+rng.Uint32N(60))<<23
		f := math.Float32frombits(b)
		if got, want := F16FromFloat32(f), refF16(f); got != want {
			t.Fatalf("F16FromFloat32(%v = %#08x) = %#04x, want %#04x", f, b, got, want)
		}
	}
}

// TestSliceConversions checks the slice forms (with their inlined fast
// paths) against the scalar ones, on values that take every path.
func TestSliceConversions(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, 5000)
	for i := range src {
		src[i] = math.Float32frombits(rng.Uint32()&0x807fffff | (90+rng.Uint32N(80))<<23)
	}
	src[0], src[1], src[2] = float32(math.NaN()), float32(math.Inf(-1)), 0
	h16, b16 := make([]uint16, len(src)), make([]uint16, len(src))
	EncodeF16(h16, src)
	EncodeBF16(b16, src)
	back := make([]float32, len(src))
	DecodeF16(back, h16)
	for i := range src {
		if h16[i] != F16FromFloat32(src[i]) || math.Float32bits(back[i]) != math.Float32bits(F16ToFloat32(h16[i])) {
			t.Fatalf("f16 element %d (%v): %#04x %v", i, src[i], h16[i], back[i])
		}
	}
	DecodeBF16(back, b16)
	for i := range src {
		if b16[i] != BF16FromFloat32(src[i]) || math.Float32bits(back[i]) != uint32(b16[i])<<16 {
			t.Fatalf("bf16 element %d (%v): %#04x %v", i, src[i], b16[i], back[i])
		}
	}
}

func TestBuffer(t *testing.T) {
	f := []float32{1, 2, 3, 4, 5}
	b := F32(f)
	if b.Len() != 5 || b.DType() != Float32 || len(b.Bytes()) != 20 {
		t.Fatalf("F32: len %d dtype %v bytes %d", b.Len(), b.DType(), len(b.Bytes()))
	}
	s := b.Slice(1, 3)
	s.Float32s()[0] = 9
	if f[1] != 9 || s.Len() != 2 {
		t.Fatalf("Slice does not share memory: %v", f)
	}
	if !sameMem(b.Slice(1, 3), s) || sameMem(b, s) || !overlaps(b, s) || overlaps(b.Slice(0, 1), s) {
		t.Fatal("sameMem/overlaps")
	}
	h := BF16(make([]uint16, 3))
	if h.Len() != 3 || h.DType() != BFloat16 || F16(nil).Len() != 0 || (Buffer{}).Len() != 0 {
		t.Fatal("16-bit buffers")
	}
	nb := NewBuffer(Float16, 3)
	if nb.Len() != 3 || len(nb.Uint16s()) != 3 {
		t.Fatal("NewBuffer")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Float32s of a bf16 buffer did not panic")
		}
	}()
	h.Float32s()
}

// TestParseDType: every spelling that bench collectives, the job's precision
// (engine/zero's former parser) and ckpt export (engine/ckpt's) accepted
// before they shared this parser is still accepted, in any case, and
// anything else is refused naming the value.
func TestParseDType(t *testing.T) {
	for want, spellings := range map[DType][]string{
		Float32:  {"", "float32", "float", "f32", "fp32", "F32", "FP32", "Float32"},
		BFloat16: {"bfloat16", "bf16", "BF16", "BFloat16"},
		Float16:  {"float16", "half", "f16", "fp16", "F16", "FP16", "Half"},
	} {
		for _, s := range spellings {
			if got, err := ParseDType(s); got != want || err != nil {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", s, got, err, want)
			}
		}
	}
	for _, s := range []string{"int8", "fp8", "f64", " f32", "bf 16"} {
		if got, err := ParseDType(s); err == nil || err.Error() != `unknown dtype "`+s+`" (want float32, bfloat16 or float16)` {
			t.Errorf("ParseDType(%q) = %v, %v; want an error naming it", s, got, err)
		}
	}
}
