package comm

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// The ring over TCP on one goroutine (algorithms_ring_tcp.go) runs for real
// sockets only, so these tests run on loopback, outside synctest bubbles:
// their timeouts are backstops, far above what the tests take.

// requireTCPRing fails the test unless every rank's ring runs on one
// goroutine: the tests below would pass on the old path too.
func requireTCPRing(t *testing.T, comms []*Communicator) {
	t.Helper()
	for r, c := range comms {
		if _, _, ok := (&opState{c: c}).ringLinks(); !ok {
			t.Fatalf("rank %d: the ring's links are not single TCP connections", r)
		}
	}
}

// TestRingTCPMatrix is the correctness matrix over TCP, with chunks small
// enough that a pass forwards chunks while others are still arriving.
func TestRingTCPMatrix(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("p%d", p), func(t *testing.T) {
			comms := tcpWorld(t, p, 1, Options{Algorithm: "ring", ChunkBytes: 1024})
			requireTCPRing(t, comms)
			runMatrix(t, comms)
		})
	}
}

// TestRingTCPLarge runs collectives of many chunks, each larger than a
// socket takes at once, so that reads and writes are partial and
// interleave, and more of them in the first step than tcpRingWindow lets
// go at once (2 chunks of 1 MiB); a striped link (two connections) keeps
// the two-goroutine ring, and must agree with the one-goroutine one
// across sizes.
func TestRingTCPLarge(t *testing.T) {
	for _, w := range []struct{ p, conns int }{{2, 1}, {3, 1}, {3, 2}} {
		t.Run(fmt.Sprintf("p%d/conns%d", w.p, w.conns), func(t *testing.T) {
			comms := tcpWorld(t, w.p, w.conns, Options{ChunkBytes: 1 << 20})
			const n = 3<<20 + 5 // f32: 12 MiB, blocks of 6 or 4 MiB in chunks of 1 MiB
			for _, a := range []caseArgs{{dt: Float32, n: n, op: Sum, salt: 1}, {dt: BFloat16, n: n, op: Avg, salt: 2}} {
				t.Run("all_reduce/"+a.dt.String(), func(t *testing.T) { testAllReduce(t, comms, a) })
				t.Run("reduce_scatter/"+a.dt.String(), func(t *testing.T) { testReduceScatter(t, comms, a) })
				t.Run("all_gather/"+a.dt.String(), func(t *testing.T) { testAllGather(t, comms, a) })
			}
		})
	}
}

// dyingTransport closes itself instead of making its Send number after.
type dyingTransport struct {
	Transport
	sends atomic.Int64
	after int64
}

func (d *dyingTransport) Connect(ctx context.Context, peer int) (Conn, error) {
	c, err := d.Transport.Connect(ctx, peer)
	if err != nil {
		return nil, err
	}
	return &dyingConn{Conn: c, d: d}, nil
}

type dyingConn struct {
	Conn
	d *dyingTransport
}

func (c *dyingConn) Send(ctx context.Context, b []byte) error {
	if c.d.sends.Add(1) > c.d.after {
		c.d.Transport.Close()
		return ErrLinkClosed
	}
	return c.Conn.Send(ctx, b)
}

// awaitWaiting returns once c's executing operation waits on a peer.
func awaitWaiting(t *testing.T, c *Communicator) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.flight.waiting.Load() < 0 {
		if time.Now().After(deadline) {
			t.Fatal("the operation never waited on a peer")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRingTCPWindow is tcpPass.sendable's rule on the ring: the header at
// once; first-step chunk i once more than i-window received items are
// done (the header, when one is due in, not counted); a later chunk once
// the chunk it forwards is in.
func TestRingTCPWindow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		hdrOut, hdrIn bool
		nFirst, win   int
		i, done       int
		want          bool
	}{
		{"first chunks go at once", false, false, 8, 2, 1, 0, true},
		{"third waits for one in", false, false, 8, 2, 2, 0, false},
		{"third goes after one in", false, false, 8, 2, 2, 1, true},
		{"last of the step", false, false, 8, 2, 7, 5, false},
		{"last of the step, 6 in", false, false, 8, 2, 7, 6, true},
		{"no window: the whole step", false, false, 8, 0, 7, 0, true},
		{"a step shorter than the window", false, false, 1, 4, 0, 0, true},
		{"second step waits for the chunk forwarded", false, false, 4, 2, 4, 0, false},
		{"second step after it", false, false, 4, 2, 4, 1, true},
		{"second step, last chunk", false, false, 4, 2, 7, 3, false},
		{"second step, last chunk after it", false, false, 4, 2, 7, 4, true},
		{"header out goes at once", true, true, 8, 2, 0, 0, true},
		{"header in not yet: one chunk", true, true, 8, 2, 1, 0, true},
		{"header in not yet: not two", true, true, 8, 2, 2, 0, false},
		{"header in, no chunk yet: two", true, true, 8, 2, 2, 1, true},
		{"header in and one chunk: three", true, true, 8, 2, 3, 2, true},
		{"header in and one chunk: not four", true, true, 8, 2, 4, 2, false},
	} {
		tp := &tcpPass{gated: true, hdrOut: tc.hdrOut, hdrIn: tc.hdrIn, nFirst: tc.nFirst, window: tc.win}
		if got := tp.sendable(tc.i, tc.done); got != tc.want {
			t.Errorf("%s: sendable(%d, %d) with nFirst %d, window %d: %v, want %v", tc.name, tc.i, tc.done, tc.nFirst, tc.win, got, tc.want)
		}
	}
}
