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
// interleave; a striped link (two connections) keeps the two-goroutine
// ring, and must agree with the one-goroutine one across sizes.
func TestRingTCPLarge(t *testing.T) {
	for _, conns := range []int{1, 2} {
		t.Run(fmt.Sprintf("conns%d", conns), func(t *testing.T) {
			comms := tcpWorld(t, 3, conns, Options{ChunkBytes: 1 << 20})
			const n = 3<<20 + 5 // f32: 12 MiB, blocks of 4 MiB in chunks of 1 MiB
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
