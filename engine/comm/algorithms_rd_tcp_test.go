package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
	"golang.org/x/sys/unix"
)

// Recursive doubling's exchanges over TCP on one goroutine
// (algorithms_rd_tcp.go) run for real sockets only: these tests run on
// loopback, outside synctest bubbles, and their timeouts are backstops.

// requireTCPLinks fails the test unless every rank reaches every other
// over a single TCP connection, the links exchangeReduce takes its pass
// over: the tests below would pass on the two-goroutine path too.
func requireTCPLinks(t *testing.T, comms []*Communicator) {
	t.Helper()
	for r, c := range comms {
		o := &opState{c: c}
		for peer := range c.size {
			if _, ok := o.tcpLink(peer); peer != r && !ok {
				t.Fatalf("rank %d: the link to rank %d is not a single TCP connection", r, peer)
			}
		}
	}
}

// TestRDTCPMatrix is the correctness matrix with recursive doubling over
// TCP (p = 3 folds a rank in first), with chunks small enough that a
// pass reduces chunks while others are still arriving.
func TestRDTCPMatrix(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("p%d", p), func(t *testing.T) {
			comms := tcpWorld(t, p, 1, Options{Algorithm: "rd", ChunkBytes: 1024})
			requireTCPLinks(t, comms)
			runMatrix(t, comms)
		})
	}
}

// TestRDTCPReduceWaitsForSend has rank 0 of 2 send slowly (a 32 KiB send
// buffer, and rank 1 reads through a 256 KiB receive buffer) while rank
// 1's data reaches rank 0 at once (4 MiB buffers that way): rank 0 holds
// the peer's bytes of a chunk long before its own have gone out, and must
// not reduce into the part of a chunk it is still sending, or rank 1
// receives partial sums and the ranks disagree. Large chunks and repeated
// calls make the window matter in every call.
func TestRDTCPReduceWaitsForSend(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{Algorithm: "rd", ChunkBytes: 1 << 20, Timeout: time.Minute})
	requireTCPLinks(t, comms)
	if err := unix.SetsockoptInt(comms[0].conns[1].(*tcpConn).sock, unix.SOL_SOCKET, unix.SO_SNDBUF, 256<<10); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(comms[1].conns[0].(*tcpConn).sock, unix.SOL_SOCKET, unix.SO_RCVBUF, 256<<10); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		a := caseArgs{dt: Float32, n: 1<<20 + 3, op: Sum, salt: i + 1}
		t.Run(fmt.Sprintf("call%d", i), func(t *testing.T) { testAllReduce(t, comms, a) })
		a.dt, a.op = BFloat16, Avg
		t.Run(fmt.Sprintf("call%d/bf16", i), func(t *testing.T) { testAllReduce(t, comms, a) })
	}
}

// TestRDTCPPeerDeath has rank 3 of 4 die after its header and two chunks
// of its first exchange: the others must fail with errors naming a peer,
// long before their timeout, and some rank must name rank 3.
func TestRDTCPPeerDeath(t *testing.T) {
	const p, dead, timeout = 4, 3, time.Minute
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
		return New(ctx, r, p, tr, Options{Algorithm: "rd", ChunkBytes: 4096, Timeout: timeout, Hosts: testHosts(p)})
	})
	requireTCPLinks(t, comms[:dead])
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

// TestRDTCPMismatch has two ranks call all-reduces of different counts:
// both must report the mismatch (each one's header reaches the other).
func TestRDTCPMismatch(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{Algorithm: "rd", Timeout: time.Minute, Hosts: testHosts(2)})
	requireTCPLinks(t, comms)
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

// TestRDTCPTimeout has rank 0 of 4 call alone: it must fail at its
// timeout, naming its first partner, rank 1, as not joining.
func TestRDTCPTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	comms := tcpWorld(t, 4, 1, Options{Algorithm: "rd", Timeout: timeout, Hosts: testHosts(4)})
	requireTCPLinks(t, comms)
	start := time.Now()
	err := comms[0].AllReduce(t.Context(), F32(make([]float32, 1<<20)), Sum)
	if d := time.Since(start); d < timeout || d > timeout+10*time.Second {
		t.Errorf("failed after %v, want the timeout %v", d, timeout)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "peer rank 1 (host h1)") {
		t.Errorf("rank 0: %v, want a timeout naming rank 1", err)
	}
}

// TestRDTCPCancelAndClose ends an exchange blocked on an absent peer by
// cancelling its context, and another by closing the communicator: each
// must return promptly with the cause.
func TestRDTCPCancelAndClose(t *testing.T) {
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			comms := tcpWorld(t, 2, 1, Options{Algorithm: "rd", Timeout: time.Minute})
			requireTCPLinks(t, comms)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			h := comms[0].AllReduceAsync(ctx, F32(make([]float32, 1<<20)), Sum)
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
