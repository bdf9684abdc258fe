package comm

import (
	"context"
	"errors"
	"fmt"
)

// Point-to-point messages, for pipeline stages. Between two ranks of a
// communicator, messages match in order: the k-th Send from a to b is the
// k-th Recv by b from a, and both must agree on dtype and length. They also
// take their place in the communicator's single order of operations, so two
// ranks must issue Sends, Recvs and the collectives they share in compatible
// orders: a Send waits for the matching Recv on transports that do not
// buffer, so rank a sending to b while b sends to a must use SendRecv.

// Send sends buf to peer, and returns once the transport has taken it.
func (c *Communicator) Send(ctx context.Context, buf Buffer, peer int) error {
	return c.do(func() error { return c.sendRecv(ctx, p2p{send: buf, to: peer, sending: true}) })
}

// Recv receives buf from peer.
func (c *Communicator) Recv(ctx context.Context, buf Buffer, peer int) error {
	return c.do(func() error { return c.sendRecv(ctx, p2p{recv: buf, from: peer, receiving: true}) })
}

// SendRecv sends send to the rank to while it receives recv from the rank
// from, both at once: a pipeline stage's exchange with its neighbours, or
// a ring shift, without deadlock. to and from may be the same rank; when
// both are this rank, send is copied to recv (a ring shift of one rank).
func (c *Communicator) SendRecv(ctx context.Context, send Buffer, to int, recv Buffer, from int) error {
	m := p2p{send: send, to: to, sending: true, recv: recv, from: from, receiving: true}
	return c.do(func() error { return c.sendRecv(ctx, m) })
}

// selfSendRecv is a SendRecv from this rank to itself: a copy.
func (c *Communicator) selfSendRecv(ctx context.Context, m p2p) error {
	verr := errors.Join(checkDType(m.send), checkSame(m.send, m.recv), checkLen("recv", m.recv, m.send.Len()), checkBlock(m.send, m.recv, m.send))
	cl := call{name: "send_recv", kind: kSend, root: -1, dt: m.send.dt, count: m.send.Len(), p2p: true, to: c.rank, from: c.rank}
	return c.run(ctx, cl, verr, func(*opState) error {
		copyInto(m.recv, m.send)
		return nil
	})
}

// SendRecvAsync is SendRecv started in the background.
func (c *Communicator) SendRecvAsync(ctx context.Context, send Buffer, to int, recv Buffer, from int) *Handle {
	m := p2p{send: send, to: to, sending: true, recv: recv, from: from, receiving: true}
	return c.async(func() error { return c.sendRecv(ctx, m) })
}

// p2p is a send, a receive, or both.
type p2p struct {
	send, recv         Buffer
	to, from           int
	sending, receiving bool
}

// sendRecv runs m. The header of a send carries the per-peer sequence
// number, which the receiver checks against its own count.
func (c *Communicator) sendRecv(ctx context.Context, m p2p) error {
	if m.sending && m.receiving && m.to == c.rank && m.from == c.rank {
		return c.selfSendRecv(ctx, m)
	}
	cl := call{name: "send_recv", kind: kSend, root: -1, p2p: true, to: -1, from: -1}
	if m.sending {
		cl.to = m.to
	}
	if m.receiving {
		cl.from = m.from
	}
	var verr error
	if m.sending {
		verr = errors.Join(c.checkPeer(m.to), checkDType(m.send))
		cl.out = &header{kind: kSend, dt: m.send.dt, alg: algDirect, root: -1, count: int64(m.send.Len())}
		if verr == nil {
			cl.out.seq = c.p2pSent[m.to]
			c.p2pSent[m.to]++
		}
		cl.name, cl.seq, cl.dt, cl.count = "send", cl.out.seq, m.send.dt, m.send.Len()
	}
	if m.receiving {
		verr = errors.Join(verr, c.checkPeer(m.from), checkDType(m.recv))
		cl.seq = 0
		if verr == nil {
			cl.seq = c.p2pRecv[m.from]
			c.p2pRecv[m.from]++
		}
		cl.name, cl.dt, cl.count = "recv", m.recv.dt, m.recv.Len()
		if m.sending {
			cl.name = "send_recv"
		}
	}
	return c.run(ctx, cl, verr, func(o *opState) error {
		var fns []func(context.Context) error
		if m.receiving {
			fns = append(fns, func(ctx context.Context) error { return o.recv(ctx, m.from, m.recv) })
		}
		if m.sending {
			fns = append(fns, func(ctx context.Context) error { return o.send(ctx, m.to, m.send) })
		}
		return par(o.ctx, fns...)
	})
}

// checkPeer rejects a peer outside the group, or this rank itself.
func (c *Communicator) checkPeer(peer int) error {
	if peer < 0 || peer >= c.size || peer == c.rank {
		return fmt.Errorf("peer %d invalid for rank %d of size %d", peer, c.rank, c.size)
	}
	return nil
}
