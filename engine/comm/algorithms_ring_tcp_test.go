package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
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

// TestRingTCPPeerDeath has rank 2 of 3 die after its header and two
// chunks: the others must fail with errors naming a peer, long before
// their timeout, and some rank must name rank 2.
func TestRingTCPPeerDeath(t *testing.T) {
	const p, dead, timeout = 3, 2, time.Minute
	store := NewMemStore()
	trs := make([]Transport, p)
	commtest.Must(t, p, nil, func(r int) error {
		tr, err := NewTCP(t.Context(), TCPConfig{Rank: r, Size: p, Store: store, Secret: tpSecret,
			Prefix: "job/0/tcp", Bind: "127.0.0.1:0", Advertise: "127.0.0.1"})
		trs[r] = tr
		return err
	})
	commtest.CloseAtEnd(t, trs)
	dying := &dyingTransport{Transport: trs[dead], after: 3}
	comms := commtest.Open(t.Context(), t, p, func(ctx context.Context, r int) (*Communicator, error) {
		tr := trs[r]
		if r == dead {
			tr = dying
		}
		return New(ctx, r, p, tr, Options{Algorithm: "ring", ChunkBytes: 4096, Timeout: timeout, Hosts: testHosts(p)})
	})
	requireTCPRing(t, comms[:dead])
	start := time.Now()
	errs := commtest.Run(p, nil, func(r int) error {
		buf, _ := makeInput(Float32, 1<<16, 1, r)
		return comms[r].AllReduce(t.Context(), buf, Sum)
	})
	if d := time.Since(start); d >= timeout/2 {
		t.Errorf("the survivors took %v to fail", d)
	}
	for r, err := range errs {
		if r != dead && (err == nil || errors.Is(err, ErrTimeout)) {
			t.Errorf("rank %d: %v, want a closed link", r, err)
		}
	}
	if named := peersNamed(t, errs, dead); !named[dead] {
		t.Errorf("no rank named the dead rank %d: %v", dead, errs)
	}
}

// TestRingTCPMismatch has two ranks call all-reduces of different counts:
// both must report the mismatch (each one's header reaches the other).
func TestRingTCPMismatch(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{Algorithm: "ring", Timeout: time.Minute, Hosts: testHosts(2)})
	requireTCPRing(t, comms)
	errs := commtest.Run(2, nil, func(r int) error {
		return comms[r].AllReduce(t.Context(), F32(make([]float32, 1000+24*r)), Sum)
	})
	for r, err := range errs {
		var me *MismatchError
		if !errors.As(err, &me) || me.Peer != 1-r || !strings.Contains(err.Error(), "count") {
			t.Errorf("rank %d: %v, want a mismatch of counts with rank %d", r, err, 1-r)
		}
	}
}

// TestRingTCPTimeout has rank 0 of 3 call alone: it must fail at its
// timeout, naming the rank it waits for (2, its left) as not joining.
func TestRingTCPTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	comms := tcpWorld(t, 3, 1, Options{Algorithm: "ring", Timeout: timeout, Hosts: testHosts(3)})
	requireTCPRing(t, comms)
	start := time.Now()
	err := comms[0].AllReduce(t.Context(), F32(make([]float32, 1000)), Sum)
	if d := time.Since(start); d < timeout || d > timeout+10*time.Second {
		t.Errorf("failed after %v, want the timeout %v", d, timeout)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "peer rank 2 (host h2)") {
		t.Errorf("rank 0: %v, want a timeout naming rank 2", err)
	}
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

// TestRingTCPCancelAndClose ends a ring pass blocked on an absent peer by
// cancelling its context, and another by closing the communicator: each
// must return promptly with the cause.
func TestRingTCPCancelAndClose(t *testing.T) {
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			comms := tcpWorld(t, 2, 1, Options{Algorithm: "ring", Timeout: time.Minute})
			requireTCPRing(t, comms)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			h := comms[0].AllReduceAsync(ctx, F32(make([]float32, 1000)), Sum)
			awaitWaiting(t, comms[0])
			start := time.Now()
			want := context.Canceled
			if how == "cancel" {
				cancel()
			} else {
				comms[0].Close()
				want = ErrClosed
			}
			err := h.Wait(t.Context())
			if !errors.Is(err, want) {
				t.Errorf("%v, want %v", err, want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v to return", d)
			}
		})
	}
}
