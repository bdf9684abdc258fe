package comm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// tcpPassCase is an algorithm that runs on the one-goroutine TCP pass
// (tcp_pass.go), with the worlds its fault tests use.
type tcpPassCase struct {
	alg     string
	require func(*testing.T, []*Communicator) // the pass really runs
	p, dead int                               // peer death: world, the rank that dies
	tp      int                               // timeout: world, where rank 0 calls alone
	waitFor string                            // the peer rank 0 names when it times out
	n       int                               // elements of the timed-out and cancelled calls
}

var tcpPassCases = []tcpPassCase{
	// The ring waits for its left neighbour, rank 2 of 3.
	{alg: "ring", require: requireTCPRing, p: 3, dead: 2, tp: 3, waitFor: "peer rank 2 (host h2)", n: 1000},
	// rd's first exchange is with rank 1.
	{alg: "rd", require: requireTCPLinks, p: 4, dead: 3, tp: 4, waitFor: "peer rank 1 (host h1)", n: 1 << 20},
}

// TestTCPPassPeerDeath has the last rank die after its header and two
// chunks: the others must fail with errors naming a peer, long before
// their timeout, and some rank must name the dead one.
func TestTCPPassPeerDeath(t *testing.T) {
	for _, tc := range tcpPassCases {
		t.Run(tc.alg, func(t *testing.T) {
			const timeout = time.Minute
			p, dead := tc.p, tc.dead
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
				return New(ctx, r, p, tr, Options{Algorithm: tc.alg, ChunkBytes: 4096, Timeout: timeout, Hosts: testHosts(p)})
			})
			tc.require(t, comms[:dead])
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
		})
	}
}

// TestTCPPassMismatch has two ranks call all-reduces of different counts:
// both must report the mismatch (each one's header reaches the other).
func TestTCPPassMismatch(t *testing.T) {
	for _, tc := range tcpPassCases {
		t.Run(tc.alg, func(t *testing.T) {
			comms := tcpWorld(t, 2, 1, Options{Algorithm: tc.alg, Timeout: time.Minute, Hosts: testHosts(2)})
			tc.require(t, comms)
			errs := commtest.Run(2, nil, func(r int) error {
				return comms[r].AllReduce(t.Context(), F32(make([]float32, 1000+24*r)), Sum)
			})
			for r, err := range errs {
				var me *MismatchError
				if !errors.As(err, &me) || me.Peer != 1-r || !strings.Contains(err.Error(), "count") {
					t.Errorf("rank %d: %v, want a mismatch of counts with rank %d", r, err, 1-r)
				}
			}
		})
	}
}

// TestTCPPassTimeout has rank 0 call alone: it must fail at its timeout,
// naming the rank it waits for as not joining.
func TestTCPPassTimeout(t *testing.T) {
	for _, tc := range tcpPassCases {
		t.Run(tc.alg, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			comms := tcpWorld(t, tc.tp, 1, Options{Algorithm: tc.alg, Timeout: timeout, Hosts: testHosts(tc.tp)})
			tc.require(t, comms)
			start := time.Now()
			err := comms[0].AllReduce(t.Context(), F32(make([]float32, tc.n)), Sum)
			if d := time.Since(start); d < timeout || d > timeout+10*time.Second {
				t.Errorf("failed after %v, want the timeout %v", d, timeout)
			}
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), tc.waitFor) {
				t.Errorf("rank 0: %v, want a timeout naming %s", err, tc.waitFor)
			}
		})
	}
}

// TestTCPPassCancelAndClose ends a pass blocked on an absent peer by
// cancelling its context, and another by closing the communicator: each
// must return promptly with the cause.
func TestTCPPassCancelAndClose(t *testing.T) {
	for _, tc := range tcpPassCases {
		for _, how := range []string{"cancel", "close"} {
			t.Run(tc.alg+"/"+how, func(t *testing.T) {
				comms := tcpWorld(t, 2, 1, Options{Algorithm: tc.alg, Timeout: time.Minute})
				tc.require(t, comms)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				h := comms[0].AllReduceAsync(ctx, F32(make([]float32, tc.n)), Sum)
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
}
