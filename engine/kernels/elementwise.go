package kernels

// The element-wise loops of GELU and of the bias gradient, with vector
// forms (elementwise_amd64.s: AVX2, eight lanes) that compute exactly what
// the Go loops here compute, operation by operation: each vector
// instruction rounds as the scalar one it replaces, and nothing is fused
// or reordered, so the results are the same bits on every path
// (TestElementwiseMatchesGo). The Go loops convert each product
// explicitly to float32, which forbids the compiler to fuse it into a
// multiply-add (it may where FMA is always available, GOAMD64=v3): the
// assembly does not fuse, and the two must agree.

// geluK holds GELU's constants as float32, as the Go loops round them:
// the constant expressions -2·√(2/π) and 3·0.044715 are folded exactly
// and rounded once.
var geluK = [4]float32{geluC, -2 * geluS, 3 * geluC, geluS}

// geluArg writes e = -2·√(2/π)·(x + 0.044715·x³), GELU's argument of the
// exponential, for len(x) values.
func geluArg(e, x []float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		geluArgAVX2(e[:n], x[:n], &geluK)
	}
	e = e[:len(x)]
	for i := n; i < len(x); i++ {
		v := x[i]
		c3 := float32(float32(geluK[0]*v)*v) * v
		e[i] = geluK[1] * (v + c3)
	}
}

// geluOut writes o = x / (1 + e) for len(x) values: GELU from x and
// e^(-2u).
func geluOut(o, x, e []float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		geluOutAVX2(o[:n], x[:n], e[:n])
	}
	o, e = o[:len(x)], e[:len(x)]
	for i := n; i < len(x); i++ {
		o[i] = x[i] / (1 + e[i])
	}
}

// geluGradOut adds gelu'(x)·d to di for len(x) values, from x and
// e = e^(-2u) (see GeluBackward).
func geluGradOut(di, x, e, d []float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		geluGradOutAVX2(di[:n], x[:n], e[:n], d[:n], &geluK)
	}
	di, e, d = di[:len(x)], e[:len(x)], d[:len(x)]
	for i := n; i < len(x); i++ {
		v := x[i]
		// e^(-2u) is +Inf for x below about -9.5; then σ = 0 and the
		// second term is 0·x (never Inf·0, which 1-σ = e·σ would give).
		sig := 1 / (1 + e[i])
		du := geluK[3] * (1 + float32(float32(geluK[2]*v)*v))
		t := float32(float32(float32(2*v)*sig)*(1-sig)) * du
		di[i] += float32((sig + t) * d[i])
	}
}

// addF64 adds d, widened to float64, to acc elementwise: one row of
// BiasBackward's column sums, in the order of the rows as before.
func addF64(acc []float64, d []float32) {
	n := 0
	if useAVX2Elem {
		n = len(d) &^ 7
		addF64AVX2(acc[:n], d[:n])
	}
	acc = acc[:len(d)]
	for i := n; i < len(d); i++ {
		acc[i] += float64(d[i])
	}
}

// addF32 adds b to o elementwise (len(o) values).
func addF32(o, b []float32) {
	n := 0
	if useAVX2Elem {
		n = len(o) &^ 7
		addToAVX2(o[:n], o[:n], b[:n])
	}
	b = b[:len(o)]
	for i := n; i < len(o); i++ {
		o[i] += b[i]
	}
}

// addTo writes out = a + b elementwise (len(out) values); out may alias
// a or b.
func addTo(out, a, b []float32) {
	n := 0
	if useAVX2Elem {
		n = len(out) &^ 7
		addToAVX2(out[:n], a[:n], b[:n])
	}
	a, b = a[:len(out)], b[:len(out)]
	for i := n; i < len(out); i++ {
		out[i] = a[i] + b[i]
	}
}

// lnOut writes o = ((x - m)·s)·w + b for len(x) values: a layer norm's
// output row from its mean m and reciprocal deviation s.
func lnOut(o, x, w, b []float32, m, s float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		lnOutAVX2(o[:n], x[:n], w[:n], b[:n], m, s)
	}
	o, w, b = o[:len(x)], w[:len(x)], b[:len(x)]
	for i := n; i < len(x); i++ {
		o[i] = float32(float32((x[i]-m)*s)*w[i]) + b[i]
	}
}

// lnGradOut adds ((w·d - gMean) - ((x - m)·s)·gxMean)·s to di for len(x)
// values: a layer norm's input gradient row.
func lnGradOut(di, x, w, d []float32, m, s, gMean, gxMean float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		lnGradOutAVX2(di[:n], x[:n], w[:n], d[:n], &[4]float32{m, s, gMean, gxMean})
	}
	di, w, d = di[:len(x)], w[:len(x)], d[:len(x)]
	for i := n; i < len(x); i++ {
		g := float32(w[i]*d[i]) - gMean
		di[i] += float32((g - float32(float32((x[i]-m)*s)*gxMean)) * s)
	}
}

// lnParamGrad adds d to dbias and ((x - m)·s)·d to dweight for len(x)
// values: one row's share of a layer norm's parameter gradients.
func lnParamGrad(dweight, dbias, d, x []float32, m, s float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		lnParamGradAVX2(dweight[:n], dbias[:n], d[:n], x[:n], m, s)
	}
	dweight, dbias, d = dweight[:len(x)], dbias[:len(x)], d[:len(x)]
	for i := n; i < len(x); i++ {
		dbias[i] += d[i]
		dweight[i] += float32(float32((x[i]-m)*s) * d[i])
	}
}

// subScalar subtracts c from every value of x.
func subScalar(x []float32, c float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		subScalarAVX2(x[:n], c)
	}
	for i := n; i < len(x); i++ {
		x[i] -= c
	}
}

// mulScalar multiplies every value of x by c.
func mulScalar(x []float32, c float32) {
	n := 0
	if useAVX2Elem {
		n = len(x) &^ 7
		mulScalarAVX2(x[:n], c)
	}
	for i := n; i < len(x); i++ {
		x[i] *= c
	}
}

// softmaxGrad writes g = p·(g - dot) for len(p) values: a softmax row's
// gradient from its probabilities and the gradient at its output.
func softmaxGrad(g, p []float32, dot float32) {
	n := 0
	if useAVX2Elem {
		n = len(p) &^ 7
		softmaxGradAVX2(g[:n], p[:n], dot)
	}
	g = g[:len(p)]
	for i := n; i < len(p); i++ {
		g[i] = p[i] * (g[i] - dot)
	}
}
