package comm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refOp applies op to one pair in float32, the way the kernels must.
func refOp(op Op, x, y float32) float32 {
	switch op {
	case Max:
		if x != x || y != y {
			return float32(math.NaN())
		}
		return max(x, y)
	case Min:
		if x != x || y != y {
			return float32(math.NaN())
		}
		return min(x, y)
	}
	return x + y
}

// randomBuffer fills n elements of dt with values of every sign and
// magnitude the dtype has, a few NaNs and infinities included.
func randomBuffer(rng *rand.Rand, dt DType, n int) Buffer {
	b := NewBuffer(dt, n)
	for i := range n {
		f := float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(40)-20)))
		switch rng.IntN(50) {
		case 0:
			f = float32(math.NaN())
		case 1:
			f = float32(math.Inf(1 - 2*rng.IntN(2)))
		}
		setF64(b, i, float64(f))
	}
	return b
}

func TestReduceKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range testDTypes {
		for _, op := range testOps {
			for _, n := range []int{0, 1, 7, 8, 9, 513, 1025} {
				for _, alias := range []string{"none", "dst=a", "dst=b"} {
					t.Run(fmt.Sprintf("%v/%v/n%d/%s", dt, op, n, alias), func(t *testing.T) {
						a, b := randomBuffer(rng, dt, n), randomBuffer(rng, dt, n)
						want := NewBuffer(dt, n)
						for i := range n {
							setF64(want, i, float64(refOp(op, float32(getF64(a, i)), float32(getF64(b, i)))))
						}
						dst := NewBuffer(dt, n)
						switch alias {
						case "dst=a":
							dst = a
						case "dst=b":
							dst = b
						}
						reduceInto(op, dst, a, b)
						for i := range n {
							g, w := getF64(dst, i), getF64(want, i)
							if g != w && !(g != g && w != w) {
								t.Fatalf("element %d: %v %v %v = %v, want %v", i, getF64(a, i), op, getF64(b, i), g, w)
							}
						}
					})
				}
			}
		}
	}
}

func TestMaxMinNaNBothOrders(t *testing.T) {
	nan := float32(math.NaN())
	for _, op := range []Op{Max, Min} {
		x, y := F32([]float32{nan, 1}), F32([]float32{1, nan})
		out := F32(make([]float32, 2))
		reduceInto(op, out, x, y)
		if f := out.Float32s(); f[0] == f[0] || f[1] == f[1] {
			t.Errorf("%v with NaN: %v", op, f)
		}
	}
}

func TestDivide(t *testing.T) {
	for _, dt := range testDTypes {
		b := NewBuffer(dt, 1001)
		for i := range 1001 {
			setF64(b, i, float64(3*i))
		}
		divide(b, 3)
		for i := range 1001 {
			if g, w := getF64(b, i), float64(float32(i)); dt == Float32 && g != w {
				t.Fatalf("%v: element %d = %v, want %v", dt, i, g, w)
			} else if math.Abs(g-w) > unitRoundoff(dt)*w*2 {
				t.Fatalf("%v: element %d = %v, want %v", dt, i, g, w)
			}
		}
	}
}

func TestBor(t *testing.T) {
	a, b := make([]byte, 19), make([]byte, 19)
	for i := range a {
		a[i], b[i] = byte(i), byte(i<<4)
	}
	out := make([]byte, 19)
	borBytes(out, a, b)
	for i := range out {
		if out[i] != byte(i)|byte(i<<4) {
			t.Fatalf("byte %d: %#x", i, out[i])
		}
	}
}

// BenchmarkReduceSum measures dst = a + b through reduceInto, with the
// kernel level this CPU gets. The bytes per second it reports are the
// bytes of dst reduced; the memory traffic is three times that (two reads
// and a write). Per-level figures, SIMD against the Go loops, are in the
// comment on the kernels in reduce.go (BenchmarkKernelReduce).
func BenchmarkReduceSum(b *testing.B) {
	for _, dt := range testDTypes {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%v/%s", dt, sizeName(size)), func(b *testing.B) {
				n := size / dt.Size()
				x, y, dst := NewBuffer(dt, n), NewBuffer(dt, n), NewBuffer(dt, n)
				for i := range n {
					setF64(x, i, float64(i%100))
					setF64(y, i, float64(i%7))
				}
				b.SetBytes(int64(size))
				for b.Loop() {
					reduceInto(Sum, dst, x, y)
				}
			})
		}
	}
}

// BenchmarkConvert measures the float32 ⇄ 16-bit conversions per element
// converted (bytes of float32).
func BenchmarkConvert(b *testing.B) {
	const n = 1 << 18
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i%1000) / 7
	}
	h := make([]uint16, n)
	back := make([]float32, n)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"EncodeBF16", func() { EncodeBF16(h, src) }},
		{"DecodeBF16", func() { DecodeBF16(back, h) }},
		{"EncodeF16", func() { EncodeF16(h, src) }},
		{"DecodeF16", func() { DecodeF16(back, h) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				tc.f()
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
