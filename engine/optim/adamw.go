package optim

// adamwK is one step's constants of the AdamW update of one part, as
// float32, in the order the vector loop (adamw_amd64.s) reads them.
type adamwK struct {
	scale, b1, omb1, b2, omb2, sqrtBC2, eps, decay, stepSize float32
}

// adamwUpdate applies the AdamW update to p with gradients g and moments
// m, v (all len(p) long): the vector loop where the CPU has one, the Go
// loop for the rest. Both round every operation to float32 in the same
// order and fuse nothing (the explicit conversions forbid the compiler
// to), so they give the same bits (TestAdamWVectorMatchesGo).
func adamwUpdate(p, g, m, v []float32, k *adamwK) {
	n := 0
	if useAVX2AdamW {
		n = len(p) &^ 7
		adamwAVX2(p[:n], g[:n], m[:n], v[:n], k)
	}
	adamwGo(p[n:], g[n:], m[n:], v[n:], k)
}

// adamwGo is adamwUpdate in Go. The gradient is always multiplied by the
// scale: by 1 it is unchanged, bit for bit.
func adamwGo(p, g, m, v []float32, k *adamwK) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for i := range p {
		gi := g[i] * k.scale
		mi := float32(k.b1*m[i]) + float32(k.omb1*gi)
		vi := float32(k.b2*v[i]) + float32(float32(k.omb2*gi)*gi)
		m[i], v[i] = mi, vi
		denom := sqrt32(vi)/k.sqrtBC2 + k.eps
		p[i] = float32(p[i]*k.decay) - float32(k.stepSize*mi)/denom
	}
}
