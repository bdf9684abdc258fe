package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Sgemm hands chunks to long-lived helper goroutines instead of starting
// goroutines per call: a go statement allocates, and a training step makes
// hundreds of calls. A helper that finishes a call looks for the next one
// for gemmSpin (in gemmOffer), then parks until it is handed one on
// gemmHelp. The spin is there because waking a parked goroutine took about
// 90 µs on the development machine (a VM whose idle vCPU has to be woken):
// a helper came too late to help a multiply of less than 100 µs at all,
// and cost more bigger ones 90 µs each.
var (
	gemmHelp     = make(chan *sgemmCall)
	gemmOffer    atomic.Pointer[sgemmCall] // the latest call that wants helpers
	gemmHelpers  atomic.Int64              // helper goroutines
	gemmSpinners atomic.Int64              // helpers looking at gemmOffer
)

const gemmSpin = 50 * time.Microsecond

// The state of a call (sgemmCall.state) counts, in its high 32 bits, the
// helpers it still wants and, in the low 32, the goroutines working on it:
// the caller and the helpers that joined. A helper joins only while the
// call wants one, so a helper that wakes late, when the call has finished
// and s perhaps serves another call, joins only a call that wants it.
const (
	gemmWant   = 1 << 32
	gemmActive = gemmWant - 1
)

// run computes s on the calling goroutine and up to s.workers-1 helpers.
// Every goroutine takes chunks from the same counter until none is left, so
// a helper that comes late, or not at all, makes the call slower, never
// wrong, and the caller waits only for helpers that joined.
func (s *sgemmCall) run() {
	want := s.workers - 1
	s.state.Store(uint64(want)*gemmWant | 1)
	if want > 0 {
		gemmOffer.Store(s)
		for range want - int(gemmSpinners.Load()) {
			s.callHelper()
		}
	}
	s.work()
	// No more joins (there is nothing left to take), and leave.
	for {
		st := s.state.Load()
		if s.state.CompareAndSwap(st, st&gemmActive-1) {
			if st&gemmActive-1 != 0 {
				s.waitHelpers()
			}
			break
		}
	}
	gemmOffer.CompareAndSwap(s, nil)
}

// waitHelpers waits until the helpers that joined s have left. It looks
// for up to gemmSpin before it parks, for the same reason as the helpers
// do: parked, the caller would take 90 µs to notice that they are done.
func (s *sgemmCall) waitHelpers() {
	for t0 := time.Now(); s.state.Load()&gemmActive != 0 && time.Since(t0) < gemmSpin; {
		runtime.Gosched()
	}
	<-s.done // the last helper to leave sends
}

// callHelper hands s to a parked helper, or starts one if none is parked,
// up to a bound that leaves room for several goroutines multiplying at
// once.
func (s *sgemmCall) callHelper() {
	select {
	case gemmHelp <- s:
	default:
		if gemmHelpers.Add(1) <= int64(4*runtime.GOMAXPROCS(0)) {
			go gemmHelper(s)
		} else {
			gemmHelpers.Add(-1)
		}
	}
}

// join adds a helper to the call if it wants one.
func (s *sgemmCall) join() bool {
	for {
		st := s.state.Load()
		if st < gemmWant {
			return false
		}
		if s.state.CompareAndSwap(st, st-gemmWant+1) {
			return true
		}
	}
}

// help works on s if it can join it.
func (s *sgemmCall) help() {
	if !s.join() {
		return
	}
	s.work()
	if s.state.Add(^uint64(0))&gemmActive == 0 {
		s.done <- struct{}{}
	}
}

// gemmHelper helps with s, then with every call it finds or is handed.
func gemmHelper(s *sgemmCall) {
	for {
		s.help()
		s = gemmSpinFor()
		if s == nil {
			s = <-gemmHelp
		}
	}
}

// gemmSpinFor looks at gemmOffer for a call that wants a helper, yielding
// the processor between looks so that the program's goroutines run first.
// It gives up once no call has been running for gemmSpin: counting from
// when the helper ran out of chunks instead made a late helper park while
// the caller was still busy, be late for the next call too, and so on.
func gemmSpinFor() *sgemmCall {
	gemmSpinners.Add(1)
	defer gemmSpinners.Add(-1)
	for idle := time.Now(); ; runtime.Gosched() {
		s := gemmOffer.Load()
		switch {
		case s == nil:
			if time.Since(idle) > gemmSpin {
				return nil
			}
		case s.state.Load() >= gemmWant:
			return s
		default:
			idle = time.Now() // running, but wants no more helpers
		}
	}
}

// gemmFreeList is a pool that, unlike sync.Pool, the garbage collector
// does not empty: the pack buffers are hundreds of KiB, and a training step
// would otherwise allocate them again after every collection. It keeps at
// most gemmFreeListCap items; more are only there while many goroutines
// multiply at once.
type gemmFreeList[T any] struct {
	mu    sync.Mutex
	items []*T
}

const gemmFreeListCap = 64

func (l *gemmFreeList[T]) get() *T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.items); n > 0 {
		x := l.items[n-1]
		l.items = l.items[:n-1]
		return x
	}
	return new(T)
}

func (l *gemmFreeList[T]) put(x *T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.items) < gemmFreeListCap {
		l.items = append(l.items, x)
	}
}
