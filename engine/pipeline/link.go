package pipeline

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
)

// link issues a rank's transfers on the pipeline group from one goroutine,
// in step order, while the rank computes. The communicator runs
// operations in the order they are issued, so a goroutine per transfer
// would race for that order; comm's own queue (its *Async methods) has no
// lone Send or Recv, which the first and last stages need.
type link struct {
	pp      *comm.Communicator
	ctx     context.Context
	q       chan *xfer
	stopped chan struct{}

	// Owned by Run's goroutine.
	inflight []*xfer // issued and not yet reaped, in order
	err      error   // the first failed transfer's error
}

// xfer is one step's communication: a Send, a Recv or a SendRecv.
type xfer struct {
	send, recv *Transfer
	sbuf, rbuf []float32
	done       chan struct{}
	err        error
}

// newLink starts the goroutine; n bounds the transfers ever issued, so
// that issue never blocks.
func newLink(ctx context.Context, pp *comm.Communicator, n int) *link {
	l := &link{pp: pp, ctx: ctx, q: make(chan *xfer, n), stopped: make(chan struct{})}
	go l.run()
	return l
}

func (l *link) run() {
	defer close(l.stopped)
	for x := range l.q {
		x.err = l.exchange(x)
		close(x.done)
	}
}

func (l *link) exchange(x *xfer) error {
	var err error
	switch {
	case x.send != nil && x.recv != nil:
		err = l.pp.SendRecv(l.ctx, comm.F32(x.sbuf), x.send.Peer, comm.F32(x.rbuf), x.recv.Peer)
	case x.send != nil:
		err = l.pp.Send(l.ctx, comm.F32(x.sbuf), x.send.Peer)
	default:
		err = l.pp.Recv(l.ctx, comm.F32(x.rbuf), x.recv.Peer)
	}
	if err == nil {
		return nil
	}
	switch {
	case x.send != nil && x.recv != nil:
		return fmt.Errorf("send %s with receive %s: %w", x.send, x.recv, err)
	case x.send != nil:
		return fmt.Errorf("send %s: %w", x.send, err)
	}
	return fmt.Errorf("receive %s: %w", x.recv, err)
}

// issue queues st's transfer: send (the previous operation's output) to
// st.Send.Peer, recv from st.Recv.Peer.
func (l *link) issue(st *Step, send, recv []float32) *xfer {
	x := &xfer{send: st.Send, recv: st.Recv, sbuf: send, rbuf: recv, done: make(chan struct{})}
	l.inflight = append(l.inflight, x)
	l.q <- x
	return x
}

// reap forgets the transfers done so far, in order, keeping the first
// error, and returns their send buffers, which are free again.
func (l *link) reap() (free [][]float32) {
	for len(l.inflight) > 0 {
		x := l.inflight[0]
		select {
		case <-x.done:
		default:
			return free
		}
		if x.err != nil && l.err == nil {
			l.err = x.err
		}
		if x.sbuf != nil {
			free = append(free, x.sbuf)
		}
		l.inflight = l.inflight[1:]
	}
	return free
}

// close waits for the transfers issued and returns the first error.
func (l *link) close() error {
	close(l.q)
	<-l.stopped
	l.reap()
	return l.err
}
