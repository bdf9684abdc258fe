package zero

import (
	"sync"

	"github.com/gtrain/gtrain/engine/comm"
)

// minSpread is the fewest elements each goroutine of spread gets:
// starting one costs microseconds, which converting this many pays for.
// Tests lower it.
var minSpread = 1 << 16

// spread runs f on [0, n) cut into at most threads contiguous ranges,
// the first on the calling goroutine, and returns when all are done. The
// engine's passes over every parameter (decoding the working copy,
// rounding gradients, clearing them, publishing the update) are memory
// bound and ran on one goroutine while the rank's other threads waited;
// each element's result depends on that element alone, so the bits do
// not depend on the split.
func spread(threads, n int, f func(lo, hi int)) {
	nw := min(threads, n/minSpread)
	if nw < 2 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for w := 1; w < nw; w++ {
		wg.Go(func() { f(w*n/nw, (w+1)*n/nw) })
	}
	f(0, n/nw)
	wg.Wait()
}

// threads is how many goroutines the engine's own passes use.
func (e *Engine) threads() int { return max(1, e.cfg.Threads) }

// decodeAll is decode on the engine's threads.
func (e *Engine) decodeAll(dst []float32, src comm.Buffer) {
	spread(e.threads(), len(dst), func(lo, hi int) { decode(dst[lo:hi], src.Slice(lo, hi)) })
}

// encodeAll is encode on the engine's threads.
func (e *Engine) encodeAll(dst comm.Buffer, src []float32) {
	spread(e.threads(), len(src), func(lo, hi int) { encode(dst.Slice(lo, hi), src[lo:hi]) })
}

// accumulateAll is accumulate on the engine's threads; fresh says that
// dst holds zeros, so that the sum is src rounded to dst's type, with no
// need to read dst.
func (e *Engine) accumulateAll(dst comm.Buffer, src []float32, fresh bool) {
	f := accumulate
	if fresh {
		f = store
	}
	spread(e.threads(), len(src), func(lo, hi int) { f(dst.Slice(lo, hi), src[lo:hi]) })
}

// clearAll zeroes b on the engine's threads.
func (e *Engine) clearAll(b comm.Buffer) {
	spread(e.threads(), b.Len(), func(lo, hi int) { clear(b.Slice(lo, hi).Bytes()) })
}
