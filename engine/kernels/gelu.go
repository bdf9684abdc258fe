package kernels

// Constants of GPT-2's GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
const (
	geluS = 0.7978845608028654 // √(2/π)
	geluC = 0.044715
)

// GeluForward writes out = gelu(inp) elementwise over len(inp) values,
// using the tanh approximation of GPT-2 (torch's gelu(approximate='tanh'),
// HF's gelu_new). Elements are shared among up to threads goroutines when
// there are at least 64K of them. out may alias inp.
//
// It evaluates the identity 0.5·(1 + tanh(u)) = 1/(1 + e^(-2u)), so
// gelu(x) = x / (1 + e^(-2u)): one exponential (expInPlace), no tanh, and
// no cancellation in 1 + tanh(u) for negative x, where tanh(u) is close to
// -1. Against a
// float64 reference over x ∈ [-10, 10] (TestGeluAccuracy) the error is
// below 1.2e-7·max(1, |x|) (two ulp of the output), the relative error
// below 6e-7 where |gelu(x)| > 0.01 and below 1.1e-5 everywhere (the
// rounding of u in float32, amplified by e^(-2u) in the far negative tail).
// The textbook float32 formula loses all relative precision there.
func GeluForward(threads int, out, inp []float32) {
	n := len(inp)
	if nw := workersFor(threads, n, n); nw > 1 {
		parallelFor(nw, n, func(_, lo, hi int) { geluRange(out[lo:hi], inp[lo:hi]) })
		return
	}
	geluRange(out, inp)
}

// geluBlock is the number of values geluRange and geluBackwardRange pass
// to expInPlace at a time: a stack buffer that stays in L1.
const geluBlock = 256

// geluRange is GeluForward on one goroutine.
func geluRange(out, inp []float32) {
	var buf [geluBlock]float32
	for i0 := 0; i0 < len(inp); i0 += geluBlock {
		x := inp[i0:min(i0+geluBlock, len(inp))]
		e := buf[:len(x)]
		geluArg(e, x)
		expInPlace(e)
		geluOut(out[i0:i0+len(x)], x, e)
	}
}

// GeluBackward adds gelu'(inp)·dout to dinp elementwise over len(inp)
// values; it accumulates. With σ = 1/(1 + e^(-2u)) (so 1 + tanh(u) = 2σ and
// sech²(u) = 4σ(1-σ)), gelu'(x) = σ + 2x·σ(1-σ)·√(2/π)·(1 + 3·0.044715·x²).
// Its accuracy is that of GeluForward.
func GeluBackward(threads int, dinp, inp, dout []float32) {
	n := len(inp)
	if nw := workersFor(threads, n, n); nw > 1 {
		parallelFor(nw, n, func(_, lo, hi int) { geluBackwardRange(dinp[lo:hi], inp[lo:hi], dout[lo:hi]) })
		return
	}
	geluBackwardRange(dinp, inp, dout)
}

// geluBackwardRange is GeluBackward on one goroutine.
func geluBackwardRange(dinp, inp, dout []float32) {
	var buf [geluBlock]float32
	for i0 := 0; i0 < len(inp); i0 += geluBlock {
		x := inp[i0:min(i0+geluBlock, len(inp))]
		e := buf[:len(x)]
		geluArg(e, x)
		expInPlace(e)
		geluGradOut(dinp[i0:i0+len(x)], x, e, dout[i0:i0+len(x)])
	}
}
