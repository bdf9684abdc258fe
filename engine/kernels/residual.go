package kernels

// Residual writes out = a + b elementwise over len(out) values; a and b
// must be at least as long, and out may alias either. It runs on the
// calling goroutine (ResidualThreads shares the elements).
func Residual(out, a, b []float32) { addTo(out, a[:len(out)], b[:len(out)]) }

// ResidualThreads is Residual with the elements shared among up to threads
// goroutines when there are at least 64K of them: it is memory bound, and
// two cores stream more bytes than one.
func ResidualThreads(threads int, out, a, b []float32) {
	n := len(out)
	a, b = a[:n], b[:n]
	if nw := workersFor(threads, n, n); nw > 1 {
		parallelFor(nw, n, func(_, lo, hi int) { addTo(out[lo:hi], a[lo:hi], b[lo:hi]) })
		return
	}
	addTo(out, a, b)
}
