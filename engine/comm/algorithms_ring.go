package comm

import "context"

// The ring. Rank r sends to r+1 and receives from r-1. An all-reduce is
// 2(p-1) steps over the p blocks of the buffer (see partition): at step s,
// rank r sends block r-s-1 and receives block r-s-2 (mod p). In the first
// p-1 steps (reduce-scatter) it combines what it receives with its own
// block; after step p-2 it holds block r fully reduced. In the last p-1
// steps (all-gather) it stores what it receives. What rank r sends at step
// s is what it received at step s-1, so one schedule covers reduce-scatter
// (steps 0..p-2), all-gather (p-1..2p-3) and all-reduce (all).
//
// Blocks are cut into chunks of Options.ChunkBytes. One goroutine receives
// (and reduces) chunk after chunk and signals each one done; the other sends
// a chunk as soon as it is done. So a rank forwards the first chunk of a
// block while the rest are still arriving: the pipeline keeps both
// directions of every link busy. When both neighbours are single TCP
// connections, ringTCP (algorithms_ring_tcp.go) runs the same schedule on
// one goroutine instead.

// ringPass is one run of the ring schedule.
type ringPass struct {
	part        blocks
	dt          DType
	first, last int // steps, inclusive
	op          Op
	local       func(b int) Buffer    // this rank's contribution to block b
	dst         func(s, b int) Buffer // where step s stores block b
	avg         bool                  // divide block r by p before sending it on
	// own, when set, is an all-gather's own block not yet in place: the
	// first step (which sends block r) sends it from here, and the pass
	// copies it into local(r) itself, over TCP while it waits for bytes.
	own Buffer
}

// src is what the ring sends at step s, block b: the rank's own data at
// step 0, else what step s-1 stored.
func (rp *ringPass) src(s, b int) Buffer {
	if s == 0 {
		return rp.local(b)
	}
	return rp.dst(s-1, b)
}

// chunks counts the chunks rank r of p receives in steps [from, to].
func (rp *ringPass) chunks(r, p, from, to, n int) int {
	total := 0
	for s := from; s <= to; s++ {
		total += (rp.part.count(mod(r-s-2, p)) + n - 1) / n
	}
	return total
}

// ring runs the pass: headers, then all chunks.
func (o *opState) ring(rp *ringPass) error {
	if in, out, ok := o.ringLinks(); ok {
		return o.ringTCP(rp, in, out) // algorithms_ring_tcp.go
	}
	p, r := o.c.size, o.c.rank
	if rp.own.b != nil {
		copyInto(rp.local(r), rp.own)
		rp.own = Buffer{}
	}
	n := o.chunkLen(rp.dt)
	ready := make(chan struct{}, rp.chunks(r, p, rp.first, rp.last-1, n))
	return par(o.ctx,
		func(ctx context.Context) error { return o.ringRecv(ctx, rp, mod(r-1, p), ready) },
		func(ctx context.Context) error { return o.ringSend(ctx, rp, mod(r+1, p), ready) })
}

func (o *opState) ringSend(ctx context.Context, rp *ringPass, peer int, ready <-chan struct{}) error {
	if err := o.sendHeader(peer); err != nil {
		return err
	}
	p, r := o.c.size, o.c.rank
	left := mod(r-1, p) // whose data the next chunk waits for
	n := o.chunkLen(rp.dt)
	for s := rp.first; s <= rp.last; s++ {
		src := rp.src(s, mod(r-s-1, p))
		for lo := 0; lo < src.Len(); lo += n {
			if s > rp.first {
				select {
				case <-ready:
				case <-ctx.Done():
					return o.c.peerErr(o.ctx, left, context.Cause(ctx))
				}
			}
			if err := o.sendRaw(ctx, peer, src.Slice(lo, min(lo+n, src.Len()))); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o *opState) ringRecv(ctx context.Context, rp *ringPass, peer int, ready chan<- struct{}) error {
	if err := o.recvHeader(ctx, peer); err != nil {
		return err
	}
	p, r := o.c.size, o.c.rank
	n := o.chunkLen(rp.dt)
	tmp := o.scratch(slotTmp, rp.dt, n)
	for s := rp.first; s <= rp.last; s++ {
		b := mod(r-s-2, p)
		dst := rp.dst(s, b)
		reducing := s < p-1
		var local Buffer
		if reducing {
			local = rp.local(b)
		}
		for lo := 0; lo < dst.Len(); lo += n {
			hi := min(lo+n, dst.Len())
			if !reducing {
				if err := o.recvRaw(ctx, peer, dst.Slice(lo, hi)); err != nil {
					return err
				}
			} else {
				t := tmp.Slice(0, hi-lo)
				if err := o.recvRaw(ctx, peer, t); err != nil {
					return err
				}
				reduceInto(rp.op, dst.Slice(lo, hi), local.Slice(lo, hi), t)
				if rp.avg && s == p-2 {
					divide(dst.Slice(lo, hi), p)
				}
			}
			if s < rp.last {
				ready <- struct{}{}
			}
		}
	}
	return nil
}

// ringAllReduce all-reduces buf in place: all 2(p-1) steps.
func (o *opState) ringAllReduce(buf Buffer, op Op) error {
	q := partition{buf.Len(), o.c.size}
	at := func(b int) Buffer { return q.block(buf, b) }
	return o.ring(&ringPass{
		part: q, dt: buf.dt, first: 0, last: 2*o.c.size - 3, op: op, avg: op == Avg,
		local: at, dst: func(_, b int) Buffer { return at(b) },
	})
}

// ringReduceScatter leaves block r (of q) of the reduction of in in out
// (which may be in's block r). Partial sums of the other blocks go to work,
// which may be in itself only when in may be overwritten.
func (o *opState) ringReduceScatter(q blocks, in, out, work Buffer, op Op) error {
	p, r := o.c.size, o.c.rank
	return o.ring(&ringPass{
		part: q, dt: in.dt, first: 0, last: p - 2, op: op, avg: op == Avg,
		local: func(b int) Buffer { return q.block(in, b) },
		dst: func(s, b int) Buffer {
			if b == r && s == p-2 {
				return out
			}
			return q.block(work, b)
		},
	})
}

// ringAllGather fills out with every rank's block (of q). Block r is own
// when that is set and not already block r of out (the pass sends it from
// there and puts it in place itself); else it must already be in place.
func (o *opState) ringAllGather(q blocks, out, own Buffer) error {
	p := o.c.size
	at := func(b int) Buffer { return q.block(out, b) }
	rp := &ringPass{
		part: q, dt: out.dt, first: p - 1, last: 2*p - 3,
		local: at, dst: func(_, b int) Buffer { return at(b) },
	}
	if own.b != nil && !sameMem(at(o.c.rank), own) {
		rp.own = own
	}
	return o.ring(rp)
}

// ringReduce reduces in into out on root: a ring reduce-scatter, then
// every rank sends its block to root, all at once.
func (o *opState) ringReduce(root int, in, out Buffer, op Op) error {
	p, r := o.c.size, o.c.rank
	q := partition{in.Len(), p}
	work := out // on root, partial sums go straight to recv
	if r != root {
		work = o.scratch(slotWork, in.dt, in.Len())
	}
	if err := o.ringReduceScatter(q, in, q.block(work, r), work, op); err != nil {
		return err
	}
	if r != root {
		return o.send(o.ctx, root, q.block(work, r))
	}
	var fns []func(context.Context) error
	for b := range p {
		if b != root {
			fns = append(fns, func(ctx context.Context) error { return o.recv(ctx, b, q.block(out, b)) })
		}
	}
	return par(o.ctx, fns...)
}

// chainBroadcast pipelines buf from root along the ring: each rank receives
// chunks from its left and forwards each to its right as soon as it has it.
// The root only sends, the last rank only receives.
func (o *opState) chainBroadcast(root int, buf Buffer) error {
	p, r := o.c.size, o.c.rank
	vr := mod(r-root, p)
	prev, next := mod(r-1, p), mod(r+1, p)
	switch vr {
	case 0:
		return o.send(o.ctx, next, buf)
	case p - 1:
		return o.recv(o.ctx, prev, buf)
	}
	n := o.chunkLen(buf.dt)
	ready := make(chan struct{}, (buf.Len()+n-1)/n)
	return par(o.ctx,
		func(ctx context.Context) error {
			if err := o.recvHeader(ctx, prev); err != nil {
				return err
			}
			for lo := 0; lo < buf.Len(); lo += n {
				if err := o.recvRaw(ctx, prev, buf.Slice(lo, min(lo+n, buf.Len()))); err != nil {
					return err
				}
				ready <- struct{}{}
			}
			return nil
		},
		func(ctx context.Context) error {
			if err := o.sendHeader(next); err != nil {
				return err
			}
			for lo := 0; lo < buf.Len(); lo += n {
				select {
				case <-ready:
				case <-ctx.Done():
					return o.c.peerErr(o.ctx, prev, context.Cause(ctx))
				}
				if err := o.sendRaw(ctx, next, buf.Slice(lo, min(lo+n, buf.Len()))); err != nil {
					return err
				}
			}
			return nil
		})
}
