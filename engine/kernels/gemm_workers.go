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
// for a while (gemmSpinFor), then parks until it is handed one on
// gemmHelp. The spin is there because waking a parked goroutine took about
// 90 µs on the development machine (a VM whose idle vCPU has to be woken):
// a helper came too late to help a multiply of less than 100 µs at all,
// and cost more bigger ones 90 µs each.
//
// Spinning is bounded, in time and in number, because a spinner keeps a P
// and its thread busy: on a host shared with other processes, or with
// more Ps than the cores the process gets, it takes them from the
// goroutines doing the work and from the runtime, and every spinner's
// runtime.Gosched takes the scheduler's global lock (see gemmSpinFor and
// gemmSpinAdmit).
var (
	gemmHelp     = make(chan *sgemmCall)
	gemmOffer    atomic.Pointer[sgemmCall] // the latest call that wants helpers
	gemmHelpers  atomic.Int64              // helper goroutines
	gemmSpinners atomic.Int64              // helpers looking at gemmOffer
	gemmParked   atomic.Int64              // helpers waiting on gemmHelp
)

// gemmSpin is how long a helper looks for a call once the one it helped has
// ended, and gemmSpinMax how long it waits for that one to end.
const (
	gemmSpin    = 50 * time.Microsecond
	gemmSpinMax = time.Millisecond
)

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
		if next := gemmSpinFor(s); next != nil {
			s = next
			continue
		}
		gemmParked.Add(1)
		s = <-gemmHelp
		gemmParked.Add(-1)
	}
}

// gemmSpinFor looks at gemmOffer for a call that wants a helper, if
// gemmSpinAdmit lets it spin at all. It keeps looking while last, the call
// the helper just left (or the next call to reuse its struct), is still
// running, for at most gemmSpinMax: giving up as soon as it ran out of
// chunks made a helper park while its caller was still busy, be late for
// the caller's next call too, and so on. Then it looks for gemmSpin more.
// Other goroutines' calls that want no more helpers do not keep it
// spinning: with several goroutines multiplying there always is one, and
// helpers then spun for good.
func gemmSpinFor(last *sgemmCall) *sgemmCall {
	if !gemmSpinAdmit() {
		return nil
	}
	defer gemmSpinners.Add(-1)
	t0 := time.Now()
	var seen time.Duration // since t0, when last was last seen running
	for ; ; runtime.Gosched() {
		if s := gemmOffer.Load(); s != nil && s.state.Load() >= gemmWant {
			return s
		}
		d := time.Since(t0)
		if last.state.Load()&gemmActive != 0 && d < gemmSpinMax {
			seen = d
		} else if d-seen > gemmSpin {
			return nil
		}
	}
}

// gemmSpinAdmit counts a new spinner unless GOMAXPROCS-1 helpers spin
// already: no call wants more, and a spinning P runs none of the program's
// other goroutines that wait behind a busy P. It takes its next goroutine
// from the global queue, where runtime.Gosched puts the spinners, so it
// never steals: with one helper spinning beside a busy goroutine, a
// goroutine that one started waited 11 ms (a time slice) to run instead of
// 0.13 ms.
func gemmSpinAdmit() bool {
	limit := int64(runtime.GOMAXPROCS(0) - 1)
	for {
		n := gemmSpinners.Load()
		if n >= limit {
			return false
		}
		if gemmSpinners.CompareAndSwap(n, n+1) {
			return true
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
