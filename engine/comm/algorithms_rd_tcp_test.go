package comm

import (
	"fmt"
	"testing"
	"time"

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
// 1's data reaches rank 0 at once (4 MiB buffers that way, set here: the
// links leave the kernel's autotuning, which starts small): rank 0 holds
// the peer's bytes of a chunk long before its own have gone out, and must
// not reduce into the part of a chunk it is still sending, or rank 1
// receives partial sums and the ranks disagree. Large chunks and repeated
// calls make the window matter in every call.
func TestRDTCPReduceWaitsForSend(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{Algorithm: "rd", ChunkBytes: 1 << 20, Timeout: time.Minute})
	requireTCPLinks(t, comms)
	for _, b := range []struct {
		c        *Communicator
		peer     int
		opt, len int
	}{
		{comms[0], 1, unix.SO_SNDBUF, 256 << 10}, // the slow way
		{comms[1], 0, unix.SO_RCVBUF, 256 << 10},
		{comms[1], 0, unix.SO_SNDBUF, 4 << 20}, // the fast way, past autotuning's start
		{comms[0], 1, unix.SO_RCVBUF, 4 << 20},
	} {
		if err := unix.SetsockoptInt(b.c.conns[b.peer].(*tcpConn).sock, unix.SOL_SOCKET, b.opt, b.len); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		a := caseArgs{dt: Float32, n: 1<<20 + 3, op: Sum, salt: i + 1}
		t.Run(fmt.Sprintf("call%d", i), func(t *testing.T) { testAllReduce(t, comms, a) })
		a.dt, a.op = BFloat16, Avg
		t.Run(fmt.Sprintf("call%d/bf16", i), func(t *testing.T) { testAllReduce(t, comms, a) })
	}
}
