package kernels

// Residual writes out = a + b elementwise over len(out) values; a and b
// must be at least as long, and out may alias either. It is memory bound and
// runs on the calling goroutine.
func Residual(out, a, b []float32) {
	a, b = a[:len(out)], b[:len(out)]
	for i := range out {
		out[i] = a[i] + b[i]
	}
}
