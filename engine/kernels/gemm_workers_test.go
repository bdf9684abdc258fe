package kernels

import (
	"math"
	"runtime"
	"testing"
	"time"
)

// gatedLevel is the Go level with blocks so small that an 8×8×4 multiply
// has four chunks, whose kernel waits until release is closed, telling
// entered (buffered) first: a test can hold helpers inside a call.
func gatedLevel(entered chan<- struct{}, release <-chan struct{}) *gemmLevel {
	lv := gemmGoLevel
	lv.kc, lv.mc, lv.nc, lv.minSplit, lv.minParallel = 4, 4, 4, 4, 0
	lv.kernT = func(k int, a []float32, lda int, b, c []float32, ldc int, alpha, beta float32) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		gemmKernelGo(k, a, lda, b, c, ldc, alpha, beta)
	}
	return &lv
}

// heldCall is a multiply whose caller (the test) stays at work: it offers
// the call and calls a helper as run does, but leaves only in finish.
type heldCall struct {
	s       *sgemmCall
	a, b, c []float32
}

func offerHeldCall(lv *gemmLevel) *heldCall {
	h := &heldCall{a: make([]float32, 8*4), b: make([]float32, 4*8), c: make([]float32, 8*8)}
	for i := range h.a {
		h.a[i] = float32(i%5) - 2
	}
	for i := range h.b {
		h.b[i] = float32(i%3) - 1
	}
	h.s = newSgemmCall(lv, 2, false, false, 8, 8, 4, 1, h.a, 4, h.b, 8, 0, h.c, 8)
	h.s.state.Store(gemmWant | 1) // one helper wanted, the caller at work
	gemmOffer.Store(h.s)
	h.s.callHelper()
	return h
}

// finish leaves the call as run does, and checks that the helper
// computed it.
func (h *heldCall) finish(t *testing.T) {
	t.Helper()
	h.s.work() // nothing left, unless no helper came
	for {
		st := h.s.state.Load()
		if h.s.state.CompareAndSwap(st, st&gemmActive-1) {
			if st&gemmActive-1 != 0 {
				h.s.waitHelpers()
			}
			break
		}
	}
	gemmOffer.CompareAndSwap(h.s, nil)
	putSgemmCall(h.s)
	want := make([]float32, len(h.c))
	sgemmRef(false, false, 8, 8, 4, 1, h.a, 4, h.b, 8, 0, want, 8)
	for i := range want {
		if math.Abs(float64(h.c[i]-want[i])) > 1e-4 {
			t.Fatalf("c[%d] = %v, want %v", i, h.c[i], want[i])
		}
	}
}

// TestGemmIdleHelpersPark checks that helpers that ran out of work park
// even while other goroutines' multiplies are still running. They used to
// spin, yielding with runtime.Gosched, for as long as any call was running,
// which with several goroutines multiplying is always: a P that spins
// never steals, so goroutines queued behind a busy P waited for its time
// slice, and on a loaded host the spinners took the CPU the callers and
// the garbage collector needed (issue 13).
//
// Three calls are held running, each with a helper stuck in its kernel;
// released, the helpers finish their calls' chunks while the callers stay
// at work, and every helper must then park: at most GOMAXPROCS-1 may spin,
// and only for gemmSpinMax and gemmSpin.
func TestGemmIdleHelpersPark(t *testing.T) {
	entered, release := make(chan struct{}, 64), make(chan struct{})
	lv := gatedLevel(entered, release)
	var calls []*heldCall
	defer func() {
		for _, h := range calls {
			h.finish(t)
		}
	}()
	for i := range 3 {
		calls = append(calls, offerHeldCall(lv))
		select {
		case <-entered: // the helper is in the kernel: the next call needs another
		case <-time.After(time.Minute):
			close(release)
			t.Fatalf("no helper joined call %d within a minute", i)
		}
	}
	close(release)
	if !waitFor(time.Minute, func() bool { return gemmParked.Load() == gemmHelpers.Load() }) {
		t.Fatalf("%d of %d helpers parked, %d spinning, a minute after they ran out of work", gemmParked.Load(), gemmHelpers.Load(), gemmSpinners.Load())
	}
}

// TestGemmSpinAdmit checks that no more than GOMAXPROCS-1 helpers spin at
// once: with more they can hold every P.
func TestGemmSpinAdmit(t *testing.T) {
	// Helpers of other tests may be spinning for a moment still.
	if !waitFor(time.Minute, func() bool { return gemmSpinners.Load() == 0 }) {
		t.Fatalf("%d helpers still spinning", gemmSpinners.Load())
	}
	procs := runtime.GOMAXPROCS(0)
	var admitted int
	for range procs + 1 {
		if gemmSpinAdmit() {
			admitted++
		}
	}
	gemmSpinners.Add(-int64(admitted))
	if admitted != procs-1 {
		t.Errorf("%d spinners admitted with GOMAXPROCS %d, want %d", admitted, procs, procs-1)
	}
}

// waitFor polls cond until it holds or d has passed (a backstop), and
// reports whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}
