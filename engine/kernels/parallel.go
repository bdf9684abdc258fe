package kernels

import "sync"

// minParallelWork is the number of elements below which an elementwise or
// row-wise kernel stays on the calling goroutine: starting and joining
// goroutines costs a few microseconds, which is more than such a kernel
// spends on 64K elements. Tests lower it to exercise the parallel paths on
// small shapes.
var minParallelWork = 1 << 16

// workersFor returns how many goroutines should share n independent units
// of work (rows, elements, (batch, head) pairs) that together touch about
// work elements: one when the caller asked for one or the work is too small
// to pay for the fan-out, otherwise threads capped at n.
func workersFor(threads, n, work int) int {
	if threads <= 1 || n <= 1 || work < minParallelWork {
		return 1
	}
	return min(threads, n)
}

// chunk returns the w-th of nw contiguous, nearly equal parts of [0, n).
func chunk(n, nw, w int) (lo, hi int) {
	return w * n / nw, (w + 1) * n / nw
}

// parallelFor splits [0, n) into nw contiguous chunks and runs fn(w, lo, hi)
// for each, chunk 0 on the calling goroutine and the others on their own,
// and returns when all have finished. w identifies the worker so that it can
// use its own slice of a scratch buffer. Kernels call it only when nw > 1:
// the closure they pass escapes, so building it on the one-goroutine path
// would allocate on every call.
func parallelFor(nw, n int, fn func(w, lo, hi int)) {
	var wg sync.WaitGroup
	for w := 1; w < nw; w++ {
		lo, hi := chunk(n, nw, w)
		wg.Go(func() { fn(w, lo, hi) })
	}
	lo, hi := chunk(n, nw, 0)
	fn(0, lo, hi)
	wg.Wait()
}
