package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// These tests run in synctest bubbles: time only moves when every goroutine
// is blocked, so "the error came before the timeout" is exact, and a
// timeout of a minute costs nothing.

func testHosts(p int) []string {
	hosts := make([]string, p)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%d", i)
	}
	return hosts
}

// peersNamed returns the peers that the errors of the ranks other than
// skip name, and fails the test if one of them did not fail with a
// PeerError or MismatchError.
func peersNamed(t *testing.T, errs []error, skip int) map[int]bool {
	t.Helper()
	named := map[int]bool{}
	for r, err := range errs {
		if r == skip {
			continue
		}
		var pe *PeerError
		var me *MismatchError
		switch {
		case errors.As(err, &pe):
			named[pe.Peer] = true
		case errors.As(err, &me):
			named[me.Peer] = true
		default:
			t.Errorf("rank %d: %v, want an error naming a peer", r, err)
		}
	}
	return named
}

func TestPeerDeath(t *testing.T) {
	for _, alg := range []string{"ring", "rd", "tree"} {
		for _, p := range []int{2, 3, 5, 8} {
			t.Run(fmt.Sprintf("%s/p%d", alg, p), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { testPeerDeath(t, alg, p) })
			})
		}
	}
}

func testPeerDeath(t *testing.T, alg string, p int) {
	const timeout = time.Minute
	comms, trs := newWorldTr(t, p, Options{Algorithm: alg, ChunkBytes: 64, Timeout: timeout, Hosts: testHosts(p)})
	dead := p - 1
	trs[dead].(*InProc).CloseAfterSends(3) // the header and two chunks, then it dies
	start := time.Now()
	errs := commtest.Run(p, nil, func(r int) error {
		buf, _ := makeInput(Float32, 4099, 1, r)
		return comms[r].AllReduce(t.Context(), buf, Sum)
	})
	if d := time.Since(start); d >= timeout {
		t.Errorf("the survivors took %v to fail, the whole timeout", d)
	}
	for r, err := range errs {
		if r != dead && errors.Is(err, ErrTimeout) {
			t.Errorf("rank %d: %v, want a closed link, not a timeout", r, err)
		}
	}
	if named := peersNamed(t, errs, dead); !named[dead] {
		t.Errorf("no rank named the dead rank %d: %v", dead, errs)
	}
	for r, c := range comms {
		if err := c.Barrier(t.Context()); !errors.Is(err, ErrAborted) && !errors.Is(err, ErrClosed) {
			t.Errorf("rank %d: after the failure: %v, want ErrAborted", r, err)
		}
	}
}

func TestStuckPeer(t *testing.T) {
	for _, alg := range []string{"ring", "rd", "tree"} {
		for _, p := range []int{2, 4, 5} {
			for _, how := range []string{"absent", "stalled"} {
				t.Run(fmt.Sprintf("%s/p%d/%s", alg, p, how), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { testStuckPeer(t, alg, p, how) })
				})
			}
		}
	}
}

// testStuckPeer has rank 1 never call the all-reduce (absent), or call it
// with a transport that stops moving (stalled; its own timeout is longer,
// as a stuck process does not time out): the others must fail after
// exactly the timeout, and the ranks waiting on it must name it.
func testStuckPeer(t *testing.T, alg string, p int, how string) {
	const timeout = 5 * time.Second
	stuck := 1
	comms, trs := newWorldOpts(t, p, func(r int) Options {
		opts := Options{Algorithm: alg, Timeout: timeout, Hosts: testHosts(p)}
		if r == stuck {
			opts.Timeout = time.Hour
		}
		return opts
	})
	if how == "stalled" {
		trs[stuck].(*InProc).Stall()
	}
	start := time.Now()
	errs := commtest.Run(p, nil, func(r int) error {
		if r == stuck && how == "absent" {
			return nil
		}
		return comms[r].AllReduce(t.Context(), F32(make([]float32, 100)), Sum)
	})
	if d := time.Since(start); d != timeout {
		t.Errorf("failed after %v, want the timeout %v", d, timeout)
	}
	if named := peersNamed(t, errs, stuck); !named[stuck] {
		t.Errorf("no rank named the stuck rank %d: %v", stuck, errs)
	}
	found := false
	for _, err := range errs {
		if err != nil && errors.Is(err, ErrTimeout) && strings.Contains(err.Error(), "peer rank 1 (host h1): timed out after 5s") {
			found = true
		}
	}
	if !found {
		t.Errorf("no error says rank 1 on h1 timed out: %v", errs)
	}
}

// mismatchCase has rank odd call something else than the others.
type mismatchCase struct {
	name string
	p    int
	alg  string
	odd  int
	call func(ctx context.Context, c *Communicator, odd bool) error
	want string // in some rank's MismatchError (the odd rank's, if it sees first)
}

func allReduceN(n int, op Op) func(context.Context, *Communicator, bool) error {
	return func(ctx context.Context, c *Communicator, odd bool) error {
		m := n
		if odd {
			m = n - 24
		}
		return c.AllReduce(ctx, F32(make([]float32, m)), op)
	}
}

var mismatchCases = []mismatchCase{
	{"count/rd", 4, "rd", 3, allReduceN(1024, Sum), "called all_reduce (count 1000, not 1024)"},
	{"count/ring", 4, "ring", 3, allReduceN(1024, Sum), "called all_reduce (count 1000, not 1024)"},
	// The odd rank 2 hears from its child 3 first and aborts before it
	// sends to its parent: only it sees the mismatch, from its side.
	{"count/tree", 5, "tree", 2, allReduceN(1024, Sum), "called all_reduce (count 1024, not 1000)"},
	{"count/p2", 2, "rd", 1, allReduceN(1024, Sum), "called all_reduce (count 1000, not 1024)"},
	{"op", 3, "rd", 1, func(ctx context.Context, c *Communicator, odd bool) error {
		op := Sum
		if odd {
			op = Max
		}
		return c.AllReduce(ctx, F32(make([]float32, 8)), op)
	}, "called all_reduce (op sum, not max)"}, // rank 0 folds into the odd rank 1
	{"collective", 4, "ring", 2, func(ctx context.Context, c *Communicator, odd bool) error {
		if odd {
			return c.ReduceScatter(ctx, F32(make([]float32, 1000)), F32(make([]float32, 250)), Sum)
		}
		return c.AllReduce(ctx, F32(make([]float32, 1024)), Sum)
	}, "called reduce_scatter (count 1000, not 1024)"},
	{"dtype", 2, "rd", 1, func(ctx context.Context, c *Communicator, odd bool) error {
		if odd {
			return c.AllReduce(ctx, BF16(make([]uint16, 8)), Sum)
		}
		return c.AllReduce(ctx, F32(make([]float32, 8)), Sum)
	}, "called all_reduce (dtype bf16, not f32)"},
	// A root mismatch along a tree can leave every rank waiting to receive,
	// before any header moves: only the timeout catches that. Along the
	// chain, the odd rank sends as a root to a rank that expects rank 0's.
	{"root", 3, "ring", 1, func(ctx context.Context, c *Communicator, odd bool) error {
		root := 0
		if odd {
			root = 1
		}
		return c.Broadcast(ctx, F32(make([]float32, 8)), root)
	}, "called broadcast (root 1, not 0)"},
	{"barrier", 3, "rd", 0, func(ctx context.Context, c *Communicator, odd bool) error {
		if odd {
			return c.Barrier(ctx)
		}
		return c.AllReduce(ctx, F32(make([]float32, 8)), Sum)
	}, "called barrier (count 0, not 8)"},
	{"send", 2, "rd", 0, func(ctx context.Context, c *Communicator, odd bool) error {
		if odd {
			return c.Send(ctx, F32(make([]float32, 9)), 1)
		}
		return c.Recv(ctx, F32(make([]float32, 8)), 0)
	}, "called send (count 9, not 8)"},
}

func TestMismatch(t *testing.T) {
	for _, tc := range mismatchCases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testMismatch(t, tc) })
		})
	}
}

func testMismatch(t *testing.T, tc mismatchCase) {
	const timeout = time.Minute
	comms := newWorld(t, tc.p, Options{Algorithm: tc.alg, Timeout: timeout, Hosts: testHosts(tc.p)})
	start := time.Now()
	errs := commtest.Run(tc.p, nil, func(r int) error { return tc.call(t.Context(), comms[r], r == tc.odd) })
	if d := time.Since(start); d >= timeout {
		t.Errorf("took the whole timeout (%v) to fail", d)
	}
	peersNamed(t, errs, -1)
	saw, mismatches := false, 0
	for r, err := range errs {
		var me *MismatchError
		if !errors.As(err, &me) {
			continue
		}
		mismatches++
		if r != tc.odd && me.Peer != tc.odd {
			t.Errorf("rank %d blames rank %d, not the odd rank %d: %v", r, me.Peer, tc.odd, err)
		}
		saw = saw || strings.Contains(err.Error(), tc.want)
	}
	if !saw {
		t.Errorf("no rank reported %q: %v", tc.want, errs)
	}
	if tc.p == 2 && tc.name != "send" && mismatches != 2 { // a send goes one way only
		t.Errorf("with two ranks exchanging, both must see the mismatch: %v", errs)
	}
}

// TestMismatchMessage pins the format of a mismatch error.
func TestMismatchMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		comms := newWorld(t, 4, Options{Algorithm: "rd", Hosts: testHosts(4)})
		errs := commtest.Run(4, nil, func(r int) error { return allReduceN(1024, Sum)(t.Context(), comms[r], r == 3) })
		want := "comm: rank 2: all_reduce #0: peer rank 3 (host h3) called all_reduce (count 1000, not 1024)"
		if errs[2] == nil || errs[2].Error() != want {
			t.Errorf("rank 2: %v\nwant %s", errs[2], want)
		}
	})
}

// TestOptionsMismatch gives ranks different ChunkBytes and Algorithm.
func TestOptionsMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		odd  Options
		want string
	}{
		{"chunk", Options{ChunkBytes: 512}, "Options.ChunkBytes differs"},
		{"algorithm", Options{Algorithm: "tree"}, "algorithm tree, not rd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				trs := NewInProc(2)
				comms := make([]*Communicator, 2)
				commtest.Must(t, 2, nil, func(r int) error {
					opts := Options{Algorithm: "rd"}
					if r == 1 {
						opts = tc.odd
					}
					var err error
					comms[r], err = New(t.Context(), r, 2, trs[r], opts)
					return err
				})
				errs := commtest.Run(2, nil, func(r int) error { return comms[r].AllReduce(t.Context(), F32(make([]float32, 8)), Sum) })
				if errs[0] == nil || !strings.Contains(errs[0].Error(), tc.want) {
					t.Errorf("rank 0: %v, want %q", errs[0], tc.want)
				}
			})
		})
	}
}

func TestCancelAbortsPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Minute
		comms := newWorld(t, 3, Options{Timeout: timeout})
		start := time.Now()
		errs := commtest.Run(3, nil, func(r int) error {
			ctx := t.Context()
			if r == 0 {
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				ctx = cctx
			}
			return comms[r].AllReduce(ctx, F32(make([]float32, 8)), Sum)
		})
		if !errors.Is(errs[0], context.Canceled) {
			t.Errorf("rank 0: %v, want context.Canceled", errs[0])
		}
		if d := time.Since(start); d >= timeout {
			t.Errorf("the peers waited for their timeout")
		}
		if named := peersNamed(t, errs, 0); !named[0] {
			t.Errorf("no peer named rank 0: %v", errs)
		}
	})
}

func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		comms := newWorld(t, 2, Options{})
		h := comms[0].AllReduceAsync(t.Context(), F32(make([]float32, 8)), Sum)
		synctest.Wait() // blocked on rank 1
		comms[0].Close()
		if err := h.Wait(t.Context()); !errors.Is(err, ErrClosed) {
			t.Errorf("pending operation: %v, want ErrClosed", err)
		}
		if err := comms[0].Barrier(t.Context()); !errors.Is(err, ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
		if err := comms[1].Barrier(t.Context()); err == nil {
			t.Errorf("peer of a closed communicator: no error")
		}
	})
}

func TestBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Communicator) error
		want string
	}{
		{"reduce_scatter recv", func(ctx context.Context, c *Communicator) error {
			return c.ReduceScatter(ctx, F32(make([]float32, 10)), F32(make([]float32, 4)), Sum)
		}, "recv has 4 elements, want 5"},
		{"all_gather dtype", func(ctx context.Context, c *Communicator) error {
			return c.AllGather(ctx, BF16(make([]uint16, 5)), F32(make([]float32, 10)))
		}, "dtypes differ"},
		{"op", func(ctx context.Context, c *Communicator) error {
			return c.AllReduce(ctx, F32(make([]float32, 10)), Op(9))
		}, "invalid reduce op"},
		{"root", func(ctx context.Context, c *Communicator) error {
			return c.Broadcast(ctx, F32(make([]float32, 10)), 2)
		}, "root 2 out of range"},
		{"zero buffer", func(ctx context.Context, c *Communicator) error {
			return c.Broadcast(ctx, Buffer{}, 0)
		}, "no dtype"},
		{"overlap", func(ctx context.Context, c *Communicator) error {
			b := F32(make([]float32, 10))
			return c.ReduceScatter(ctx, b, b.Slice(1, 6), Sum)
		}, "overlap"},
		{"self", func(ctx context.Context, c *Communicator) error {
			return c.Send(ctx, F32(make([]float32, 1)), 0)
		}, "peer 0 invalid for rank 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newWorld(t, 2, Options{})[0]
			err := tc.call(t.Context(), c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want %q", err, tc.want)
			}
		})
	}
}
