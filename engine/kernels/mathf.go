package kernels

import "math"

// Constants of expInPlace; exp_amd64.s holds the same values as bit
// patterns, and the two must change together. The reduction x = n·ln2 + r splits ln2 into a short
// high part (exact when multiplied by any n in [-125, 128]) and a low
// correction, so r keeps full float32 precision (Cody and Waite). The
// polynomial is Cephes' expf minimax fit on |r| ≤ ln2/2.
const (
	expLog2e = 1.44269504088896341
	expLn2Hi = 0.693359375
	expLn2Lo = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
	// expRound is 1.5·2^23: adding it to a float32 of magnitude < 2^22
	// leaves the value rounded to the nearest integer in the low mantissa
	// bits, which is cheaper than math.Round and a float64 round trip.
	expRound = 12582912.0
	// Above expMax e^x overflows float32. Below expMin (e^x < 1.8e-38,
	// just above the smallest normal float32) expInPlace returns 0: that
	// keeps 2^(n-1) a normal number, and such terms vanish next to the
	// largest term of a softmax anyway.
	expMin = -86.9
	expMax = 88.72283
)

// expInPlace replaces each x[i] by e^x[i] in float32, with a relative error
// below 2 ulp (about 1.2e-7; TestExpAccuracy measures it against
// math.Exp). It gives 0 below expMin (about -86.9) rather than a tiny or
// subnormal number, +Inf above expMax, and NaN for NaN. The softmaxes,
// cross-entropy and GELU use it instead of math.Exp, which works in float64
// and is several times slower. It works on slices so that the AVX2 version
// (exp_amd64.s) can take eight values at a time, and because the scalar
// body is too large for the compiler to inline: a call per element would
// cost as much as the polynomial.
func expInPlace(x []float32) {
	if useAVX2Exp {
		expInPlaceAVX2(x)
		return
	}
	expInPlaceGo(x)
}

// expInPlaceGo is expInPlace in portable Go.
func expInPlaceGo(x []float32) {
	for i, v := range x {
		switch {
		case v < expMin:
			x[i] = 0
			continue
		case v > expMax:
			x[i] = float32(math.Inf(1))
			continue
		}
		// float32(...) forces the rounding step; without it the compiler
		// may keep the sum at higher precision or fuse it.
		z := float32(v*expLog2e + expRound)
		n := z - expRound
		r := v - n*expLn2Hi - n*expLn2Lo
		p := ((((expP0*r+expP1)*r+expP2)*r+expP3)*r+expP4)*r + expP5
		p = p*r*r + r + 1
		// z's low mantissa bits hold n. Scaling by 2·2^(n-1) rather than
		// 2^n keeps the exponent field in range for n = 128 (v near
		// expMax).
		k := int32(math.Float32bits(z)) - int32(math.Float32bits(expRound))
		x[i] = (2 * p) * math.Float32frombits(uint32(k+126)<<23)
	}
}

// sum32 returns the sum of x in float32. Four partial sums let the adds
// overlap instead of each waiting for the one before (the compiler does not
// vectorise or reassociate), and as a side effect lower the rounding error.
func sum32(x []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		s0 += v[0]
		s1 += v[1]
		s2 += v[2]
		s3 += v[3]
	}
	for ; i < len(x); i++ {
		s0 += x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dot32 returns Σ a[i]·b[i] over len(a) values in float32, with four
// partial sums for the same reason as sum32.
func dot32(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		x, y := a[i:i+4:i+4], b[i:i+4:i+4]
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// sum64 returns the sum of x accumulated in float64, with two partial sums
// for the same reason as sum32.
func sum64(x []float32) float64 {
	var s0, s1 float64
	i := 0
	for ; i+2 <= len(x); i += 2 {
		v := x[i : i+2 : i+2]
		s0 += float64(v[0])
		s1 += float64(v[1])
	}
	if i < len(x) {
		s0 += float64(x[i])
	}
	return s0 + s1
}

// max32 returns the largest element of x, which must not be empty. It
// compares rather than calling the max builtin, whose NaN and signed-zero
// rules cost several instructions per element, and keeps four running
// maxima for the same reason sum32 keeps four sums. A NaN in x may or may
// not be returned; the kernels' outputs are NaN either way. From 32
// elements on, the AVX2 loop takes the maxima of 32 lanes at once: a
// maximum is the same value in any order (unlike sum32's and dot32's
// sums, which stay in Go), up to the sign of a zero maximum, which
// neither x - max nor exp(x - max) can tell.
func max32(x []float32) float32 {
	if useAVX2Elem && len(x) >= 32 {
		var lanes [8]float32
		n := len(x) &^ 31
		max32AVX2(x[:n], &lanes)
		m := max(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7])
		for _, v := range x[n:] {
			if v > m {
				m = v
			}
		}
		return m
	}
	return max32Go(x)
}

// max32Go is max32 without the vector loop.
func max32Go(x []float32) float32 {
	m0 := x[0]
	m1, m2, m3 := m0, m0, m0
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		if v[0] > m0 {
			m0 = v[0]
		}
		if v[1] > m1 {
			m1 = v[1]
		}
		if v[2] > m2 {
			m2 = v[2]
		}
		if v[3] > m3 {
			m3 = v[3]
		}
	}
	for ; i < len(x); i++ {
		if x[i] > m0 {
			m0 = x[i]
		}
	}
	return max(m0, m1, m2, m3)
}
