package comm

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// TestPipeline passes activations forward through 4 stages with Send and
// Recv, then gradients backward with SendRecv, interleaved with a
// collective, as pipeline parallelism does.
func TestPipeline(t *testing.T) {
	const p, n = 4, 1003
	comms := newWorld(t, p, Options{ChunkBytes: 512})
	act := make([]Buffer, p)
	for r := range p {
		act[r] = NewBuffer(BFloat16, n)
	}
	first, _ := makeInput(BFloat16, n, 1, 0)
	copy(act[0].Bytes(), first.Bytes())
	commtest.Must(t, p, nil, func(r int) error {
		c := comms[r]
		if r > 0 {
			if err := c.Recv(t.Context(), act[r], r-1); err != nil {
				return err
			}
		}
		if r < p-1 {
			if err := c.Send(t.Context(), act[r], r+1); err != nil {
				return err
			}
		}
		return c.Barrier(t.Context())
	})
	for r := range p {
		checkBits(t, fmt.Sprintf("stage %d", r), act[r].Bytes(), first.Bytes())
	}

	// A ring shift with SendRecv, every rank sending and receiving at once.
	out, in := make([]Buffer, p), make([]Buffer, p)
	for r := range p {
		out[r], _ = makeInput(Float32, n, 2, r)
		in[r] = garbage(Float32, n)
	}
	commtest.Must(t, p, nil, func(r int) error {
		h := comms[r].SendRecvAsync(t.Context(), out[r], (r+1)%p, in[r], (r+p-1)%p)
		return h.Wait(t.Context())
	})
	for r := range p {
		checkBits(t, fmt.Sprintf("rank %d", r), in[r].Bytes(), out[(r+p-1)%p].Bytes())
	}
}

// TestSendRecvSamePeer exchanges between two ranks with SendRecv, which
// plain Send then Recv on both sides could not do on an unbuffered
// transport.
func TestSendRecvSamePeer(t *testing.T) {
	comms := newWorld(t, 2, Options{ChunkBytes: 64})
	out := []Buffer{F32([]float32{1, 2, 3}), F32([]float32{4, 5, 6})}
	in := []Buffer{F32(make([]float32, 3)), F32(make([]float32, 3))}
	for range 3 { // several rounds: per-peer sequence numbers advance
		commtest.Must(t, 2, nil, func(r int) error { return comms[r].SendRecv(t.Context(), out[r], 1-r, in[r], 1-r) })
	}
	for r := range 2 {
		checkBits(t, fmt.Sprintf("rank %d", r), in[r].Bytes(), out[1-r].Bytes())
	}
}

// TestSendRecvSelf: a SendRecv from a rank to itself copies, in a group of
// one and of three; a length mismatch is an argument error.
func TestSendRecvSelf(t *testing.T) {
	for _, p := range []int{1, 3} {
		comms := newWorld(t, p, Options{})
		errs := commtest.Run(p, nil, func(r int) error {
			send, recv := F32([]float32{float32(r), 2, 3}), NewBuffer(Float32, 3)
			if err := comms[r].SendRecv(context.Background(), send, r, recv, r); err != nil {
				return err
			}
			if got := recv.Float32s(); got[0] != float32(r) || got[2] != 3 {
				return fmt.Errorf("got %v", got)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("p %d rank %d: %v", p, r, err)
			}
		}
	}
	c := newWorld(t, 1, Options{})[0]
	err := c.SendRecv(context.Background(), NewBuffer(Float32, 3), 0, NewBuffer(Float32, 2), 0)
	if err == nil || !strings.Contains(err.Error(), "recv has 2 elements, want 3") {
		t.Fatalf("length mismatch: %v", err)
	}
}
