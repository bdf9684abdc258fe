package comm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeTCPSys is a clock that moves step per reading, and counts of the
// CPU given away and of poll(2) calls, which never block. Hooks run at
// each yield and poll, with the count so far.
type fakeTCPSys struct {
	at                      time.Time
	tick                    time.Duration
	goscheds, yields, polls int
	onYield, onPoll         func(n int)
}

func newFakeTCPSys(tick time.Duration) *fakeTCPSys {
	return &fakeTCPSys{at: time.Unix(1000, 0), tick: tick}
}

func (f *fakeTCPSys) now() time.Time { f.at = f.at.Add(f.tick); return f.at }

func (f *fakeTCPSys) gosched() {
	f.goscheds++
	if f.onYield != nil {
		f.onYield(f.goscheds + f.yields)
	}
}

func (f *fakeTCPSys) schedYield() {
	f.yields++
	if f.onYield != nil {
		f.onYield(f.goscheds + f.yields)
	}
}

func (f *fakeTCPSys) poll(fds []unix.PollFd, _ time.Duration) error {
	f.polls++
	if f.onPoll != nil {
		f.onPoll(f.polls)
	}
	return nil
}

func (f *fakeTCPSys) given() int { return f.goscheds + f.yields }

// useTCPSys makes every TCP link of c wait through sys with budget spin.
func useTCPSys(t *testing.T, c *Communicator, spin time.Duration, sys tcpSys) {
	t.Helper()
	n := 0
	for _, cn := range c.conns {
		if tc, ok := cn.(*tcpConn); ok {
			tc.wait, tc.spinBo = tcpWaitConfig{budget: spin, sys: sys}, tcpBackoff{}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no TCP links to wait on")
	}
}

// TestRingTCPSpinThenSleep has rank 0 of 2 call an all-reduce alone, so
// that its ring pass waits for a peer that never sends: with a budget of
// 50 µs on a clock that moves 1 µs a reading, it must give the CPU away a
// bounded number of times, then only sleep in poll(2) until cancelled
// (at the fifth poll), and report the cancellation. With no budget it
// must sleep at once.
func TestRingTCPSpinThenSleep(t *testing.T) {
	for _, spin := range []time.Duration{50 * time.Microsecond, 0} {
		t.Run(spin.String(), func(t *testing.T) {
			comms := tcpWorld(t, 2, 1, Options{Algorithm: "ring", Timeout: time.Minute, Hosts: testHosts(2)})
			requireTCPRing(t, comms)
			sys := newFakeTCPSys(time.Microsecond)
			useTCPSys(t, comms[0], spin, sys)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			atFirstPoll := -1
			sys.onPoll = func(n int) {
				if n == 1 {
					atFirstPoll = sys.given()
				}
				if n == 5 {
					cancel()
				}
			}
			err := comms[0].AllReduce(ctx, F32(make([]float32, 1000)), Sum)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%v, want the cancellation", err)
			}
			if sys.polls != 5 {
				t.Errorf("%d polls, want 5 (the pass ends at the cancel)", sys.polls)
			}
			switch {
			case spin == 0 && atFirstPoll != 0:
				t.Errorf("no budget: gave the CPU away %d times before sleeping, want 0", atFirstPoll)
			case spin > 0 && (atFirstPoll < 1 || atFirstPoll > 50):
				t.Errorf("gave the CPU away %d times before sleeping, want 1 to 50 (a 50 µs budget, 1 µs a look at least)", atFirstPoll)
			case spin > 0 && (sys.goscheds == 0 || sys.yields == 0):
				t.Errorf("Gosched %d times and sched_yield %d, want both", sys.goscheds, sys.yields)
			}
			if sys.given() != atFirstPoll {
				t.Errorf("gave the CPU away %d times after the first sleep, want none until something moves", sys.given()-atFirstPoll)
			}
		})
	}
}

// TestRingTCPCancelWhileSpinning cancels a pass in the middle of its spin
// (a budget far longer than the test, on a clock that stands still): the
// pass must notice at its next look, without sleeping.
func TestRingTCPCancelWhileSpinning(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{Algorithm: "ring", Timeout: time.Minute, Hosts: testHosts(2)})
	requireTCPRing(t, comms)
	sys := newFakeTCPSys(0)
	useTCPSys(t, comms[0], MaxTCPSpinWait, sys)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sys.onYield = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	err := comms[0].AllReduce(ctx, F32(make([]float32, 1000)), Sum)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want the cancellation", err)
	}
	if sys.given() != 3 || sys.polls != 0 {
		t.Errorf("gave the CPU away %d times and polled %d, want 3 and 0", sys.given(), sys.polls)
	}
}

// spinWaits runs waits on idle, each ended by a move after the given
// number of looks (-1: one that spins until it sleeps), and returns how
// many looks of each spun. A wait that sleeps sleeps for slept.
func spinWaits(idle *tcpIdle, sys *fakeTCPSys, slept time.Duration, looks ...int) []int {
	var spun []int
	for _, n := range looks {
		k := 0
		for idle.spin() {
			k++
			if k == n {
				break
			}
		}
		if idle.asleep {
			sys.at = sys.at.Add(slept)
		}
		spun = append(spun, k)
		idle.moved()
	}
	return spun
}

// TestTCPIdleBacksOff checks the link's memory of its waits, on a clock
// that moves 1 µs a reading with a 10 µs budget: a wait that runs out of
// budget makes the next 1, then 2, then 4 ... (at most tcpMaxSkip) waits
// sleep at once; a spin that ends in a move forgets the misses; looks far
// apart (another thread ran) are a miss too.
func TestTCPIdleBacksOff(t *testing.T) {
	sys := newFakeTCPSys(time.Microsecond)
	idle := &tcpIdle{tcpWaitConfig: tcpWaitConfig{budget: 10 * time.Microsecond, sys: sys}, bo: &tcpBackoff{}}
	// -1: nothing moves while it spins (the budget runs out: 10 looks).
	got := spinWaits(idle, sys, time.Millisecond, 2, -1, -1, -1, -1, -1, -1, -1)
	// a hit (2 looks), a miss, 1 skipped, a miss, 2 skipped, a miss, ...
	want := []int{2, 10, 0, 10, 0, 0, 10, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("looks spun per wait %v, want %v", got, want)
	}
	// 3 of 4 skipped waits are left; the next spins, and its hit clears
	// the misses: the miss after it skips 1 wait again.
	got = spinWaits(idle, sys, time.Millisecond, -1, -1, -1, 1, -1, -1, -1)
	want = []int{0, 0, 0, 1, 10, 0, 10}
	if !slices.Equal(got, want) {
		t.Fatalf("after the skips: looks spun per wait %v, want %v", got, want)
	}
	for range 20 {
		idle.bo.miss()
	}
	if idle.bo.skip != tcpMaxSkip {
		t.Errorf("after many misses %d waits are skipped, want at most %d", idle.bo.skip, tcpMaxSkip)
	}
	// A wait skipped (asleep from its first look) whose bytes come within
	// the budget clears the misses: the next wait spins again. One whose
	// bytes take longer than the budget leaves them.
	if got := spinWaits(idle, sys, 2*idle.budget, -1, -1); !slices.Equal(got, []int{0, 0}) || idle.bo.skip != tcpMaxSkip-2 {
		t.Fatalf("long sleeps: looks spun per wait %v with %d waits left to skip, want [0 0] and %d", got, idle.bo.skip, tcpMaxSkip-2)
	}
	if got := spinWaits(idle, sys, 0, -1, 3); !slices.Equal(got, []int{0, 3}) || idle.bo.skip != 0 {
		t.Errorf("a short sleep: looks spun per wait %v with %d waits left to skip, want [0 3] and none", got, idle.bo.skip)
	}

	// Descheduled between looks: a miss, though the budget is not spent.
	sys = newFakeTCPSys(time.Microsecond)
	idle = &tcpIdle{tcpWaitConfig: tcpWaitConfig{budget: time.Millisecond, sys: sys}, bo: &tcpBackoff{}}
	sys.onYield = func(n int) {
		if n == 2 {
			sys.at = sys.at.Add(tcpLookGap)
		}
	}
	if got := spinWaits(idle, sys, time.Millisecond, -1, -1); !slices.Equal(got, []int{2, 0}) {
		t.Errorf("with another thread run between looks: looks spun per wait %v, want [2 0]", got)
	}
}

// TestTCPSpinWaitConfig checks TCPConfig.SpinWait: 0 is the default,
// negative none, and more than MaxTCPSpinWait is refused by NewTCP.
func TestTCPSpinWaitConfig(t *testing.T) {
	for _, tc := range []struct {
		in, want time.Duration
		err      bool
	}{
		{0, DefaultTCPSpinWait, false},
		{-1, 0, false},
		{time.Microsecond, time.Microsecond, false},
		{MaxTCPSpinWait, MaxTCPSpinWait, false},
		{MaxTCPSpinWait + 1, 0, true},
	} {
		got, err := tcpSpinWait(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("tcpSpinWait(%v) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	_, err := NewTCP(t.Context(), TCPConfig{Rank: 0, Size: 2, Store: NewMemStore(), Secret: tpSecret,
		Prefix: "job/0/tcp", Bind: "127.0.0.1:0", Advertise: "127.0.0.1", SpinWait: time.Second})
	if err == nil || !strings.Contains(err.Error(), "spin wait 1s: want at most 10ms") {
		t.Errorf("NewTCP with a spin wait of 1s: %v, want it refused", err)
	}
}

// TestRingTCPMatrixSpinning is the correctness matrix over TCP with every
// link spinning (the real system calls, a 200 µs budget), so that passes
// move bytes between looks of a spin as well as after a sleep.
func TestRingTCPMatrixSpinning(t *testing.T) {
	comms := tcpWorld(t, 3, 1, Options{Algorithm: "ring", ChunkBytes: 1024})
	requireTCPRing(t, comms)
	for _, c := range comms {
		useTCPSys(t, c, 200*time.Microsecond, osTCPSys{})
	}
	runMatrix(t, comms)
}
