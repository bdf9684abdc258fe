package comm

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// How a pass over TCP (tcp_pass.go: the ring, rd's exchanges) waits when
// neither of its sockets can move: first it may keep looking without
// sleeping for up to TCPConfig.SpinWait, giving the CPU away between
// looks (runtime.Gosched to this rank's other goroutines, sched_yield to
// another thread or process that wants this core), then it sleeps in
// poll(2). This is Open
// MPI's tcp btl under --oversubscribe (it polls its sockets without
// blocking and yields between polls), bounded. A thread asleep in poll(2)
// is woken for every segment that lands, and on this Firecracker VM a
// wake-up costs several µs: a 64 KiB round trip between two processes
// over a veth pair took 51 µs blocking against 17 spinning (C, 2026-11-26,
// load 4), and in a quiet moment the 2-rank all-gather of 64 KiB across
// two network-namespace hosts took 14 µs spinning against 45 sleeping.
//
// But a spinning rank holds its core: where other threads want the cores
// (a loaded host, a rank's compute threads), the peer it waits for may be
// the one kept off a core; at load 3-8 the same all-gather took 150-250
// µs with a plain 100 µs spin, and most spins ran out of budget. So a link
// remembers how its waits went: a wait whose budget ran out before
// anything moved, or whose looks were far apart (another thread ran in
// between), was a miss, and the link's next waits sleep at once, 1, 2, 4
// ... up to tcpMaxSkip of them after successive misses; a spin that ends
// in a move clears that, and so does a wait slept at once whose bytes came
// within the budget. A stalled peer costs at most the budget once,
// then a budget per tcpMaxSkip waits.
//
// The default is a 200 µs spin. Measured through docs/bench/tcp_spin.sh
// on an idle 2-core machine, two network-namespace hosts of one rank each
// (reno links, 2026-11-26; docs/benchmarks.md): against sleeping at once,
// a 200 µs spin made all-reduce, reduce-scatter and all-gather of 64 KiB
// 1.4-4.8x faster and of 128 KiB-4 MiB 1.1-3.5x (medians of 3 rounds).
// 50 µs was about level with 200 µs (ahead at some sizes, behind at
// others); 100 µs, in the same run, behind both from 512 KiB.
// Open MPI's tcp btl and NCCL's socket transport spin without any bound.
// Under load (another process on the cores, 3-7 threads wanting 2) the
// back-off above bounds what a spin costs: earlier runs there measured a
// 100 µs spin 0.44-1.55x of sleeping. GTRAIN_COMM_SPIN_US=0 turns it off.

// Bounds of TCPConfig.SpinWait (and of GTRAIN_COMM_SPIN_US).
const (
	DefaultTCPSpinWait = 200 * time.Microsecond
	MaxTCPSpinWait     = 10 * time.Millisecond
)

const (
	// tcpLookGap between two looks of a spin means another thread ran in
	// between: a look takes about a µs, a sched_yield with no one else to
	// run about as long.
	tcpLookGap = 25 * time.Microsecond
	// tcpMaxSkip is the most waits a link sleeps at once after misses.
	tcpMaxSkip = 256
)

// tcpSys is what a waiting ring pass asks of the system: the clock, giving
// the CPU away, and poll(2). Tests replace it to count and steer waits.
type tcpSys interface {
	now() time.Time
	gosched()
	schedYield()
	poll(fds []unix.PollFd, timeout time.Duration) error
}

type osTCPSys struct{}

func (osTCPSys) now() time.Time { return time.Now() }
func (osTCPSys) gosched()       { runtime.Gosched() }
func (osTCPSys) schedYield()    { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) } // raw: see tcp_fd.go

// poll waits in poll(2) for up to timeout and a millisecond more (poll
// counts whole ones; a deadline just passed waits for ctx to say so).
func (osTCPSys) poll(fds []unix.PollFd, timeout time.Duration) error {
	ms := int(timeout.Milliseconds()) + 1
	if _, err := unix.Poll(fds, ms); err != nil && err != syscall.EINTR {
		return os.NewSyscallError("poll", err)
	}
	return nil
}

// tcpWaitConfig is how a link's ring passes wait, from TCPConfig.
type tcpWaitConfig struct {
	budget time.Duration // 0: sleep in poll(2) at once
	sys    tcpSys
}

// tcpBackoff is what a link remembers of its waits: how many to sleep at
// once before spinning again, and how many after the next miss.
type tcpBackoff struct {
	skip, pause int
}

func (b *tcpBackoff) miss() {
	b.pause = min(max(2*b.pause, 1), tcpMaxSkip)
	b.skip = b.pause
}

func (b *tcpBackoff) hit() { b.skip, b.pause = 0, 0 }

// tcpIdle paces the waits of one ring pass: a stretch of looks that found
// nothing to move is a wait; it spins for at most the budget, then sleeps.
type tcpIdle struct {
	tcpWaitConfig
	bo          *tcpBackoff // the link's, under its recvMu
	since, last time.Time
	looks       int  // of this wait
	asleep      bool // this wait no longer spins
}

// moved ends the current wait: the next look that finds nothing starts a
// new one.
func (w *tcpIdle) moved() {
	switch {
	case w.looks > 0 && !w.asleep:
		w.bo.hit()
	case w.looks == 0 && w.asleep && w.sys.now().Sub(w.since) < w.budget:
		// A wait the back-off made sleep from its first look, whose bytes
		// came within the budget: a spin would have caught them, so the
		// peer is no longer stalled (the misses were the job starting, or
		// a peer that has caught up since). Without this, the misses of a
		// job's first calls, whose peers join at different times, kept
		// up to tcpMaxSkip of the calls after them asleep. Measured across
		// 2 hosts with 5 warm-up calls (docs/bench/tcp_spin.sh, 3 rounds,
		// 64 KiB-4 MiB), this made 19 of the 21 collective-size pairs
		// 1.10-2.26x faster and 2 0.82-0.88x.
		w.bo.hit()
	}
	w.looks, w.asleep = 0, false
}

// spin reports whether to look again without sleeping, after giving the
// CPU away for a moment; false once this wait sleeps (its budget spent, a
// miss, or the link backing off), and then until the pass moves again.
func (w *tcpIdle) spin() bool {
	if w.budget <= 0 || w.asleep {
		return false
	}
	now := w.sys.now()
	if w.looks == 0 {
		if w.bo.skip > 0 {
			w.bo.skip--
			w.since, w.asleep = now, true
			return false
		}
		w.since, w.last = now, now
	}
	w.looks++
	if now.Sub(w.since) >= w.budget || now.Sub(w.last) >= tcpLookGap {
		w.bo.miss()
		w.asleep = true
		return false
	}
	w.last = now
	if w.looks%2 == 0 {
		w.sys.gosched() // another goroutine of this rank may be the one to make progress
	} else {
		w.sys.schedYield() // or another thread: the peer, if it shares this core
	}
	return true
}

// tcpSpinWait checks TCPConfig.SpinWait: 0 is the default, negative none.
// The result is the budget: 0 for none.
func tcpSpinWait(d time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return DefaultTCPSpinWait, nil
	case d < 0:
		return 0, nil
	case d > MaxTCPSpinWait:
		return 0, fmt.Errorf("spin wait %v: want at most %v", d, MaxTCPSpinWait)
	}
	return d, nil
}
