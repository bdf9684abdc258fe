package comm

import (
	"context"
	"errors"
	"fmt"
)

// AllReduce reduces buf over all ranks with op, in place: afterwards every
// rank holds the same result, bit for bit.
func (c *Communicator) AllReduce(ctx context.Context, buf Buffer, op Op) error {
	return c.do(func() error { return c.allReduce(ctx, buf, op) })
}

// AllReduceAsync is AllReduce started in the background: buf must not be
// touched until the Handle is done.
func (c *Communicator) AllReduceAsync(ctx context.Context, buf Buffer, op Op) *Handle {
	return c.async(func() error { return c.allReduce(ctx, buf, op) })
}

// ReduceScatter reduces send over all ranks with op and leaves block r of
// the result in recv on rank r. Blocks follow MPI's rule for uneven counts:
// with n = send.Len() and p ranks, block i has n/p+1 elements if i < n%p,
// else n/p, in rank order. recv may be send's own block (in place).
func (c *Communicator) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error {
	return c.do(func() error { return c.reduceScatter(ctx, send, recv, op) })
}

// ReduceScatterAsync is ReduceScatter started in the background.
func (c *Communicator) ReduceScatterAsync(ctx context.Context, send, recv Buffer, op Op) *Handle {
	return c.async(func() error { return c.reduceScatter(ctx, send, recv, op) })
}

// AllGather collects every rank's send into recv on all ranks: rank i's
// send is block i of recv, with the blocks of ReduceScatter (so send.Len()
// is recv.Len()/p, or one more on the first recv.Len()%p ranks). send may be
// recv's own block (in place).
func (c *Communicator) AllGather(ctx context.Context, send, recv Buffer) error {
	return c.do(func() error { return c.allGather(ctx, kAllGather, send, recv) })
}

// AllGatherAsync is AllGather started in the background.
func (c *Communicator) AllGatherAsync(ctx context.Context, send, recv Buffer) *Handle {
	return c.async(func() error { return c.allGather(ctx, kAllGather, send, recv) })
}

// Broadcast copies buf from root to every other rank.
func (c *Communicator) Broadcast(ctx context.Context, buf Buffer, root int) error {
	return c.do(func() error { return c.broadcast(ctx, buf, root) })
}

// BroadcastAsync is Broadcast started in the background.
func (c *Communicator) BroadcastAsync(ctx context.Context, buf Buffer, root int) *Handle {
	return c.async(func() error { return c.broadcast(ctx, buf, root) })
}

// Reduce reduces send over all ranks with op into recv on root. recv is
// only used on root (elsewhere it may be the zero Buffer), and may be send
// (in place).
func (c *Communicator) Reduce(ctx context.Context, send, recv Buffer, op Op, root int) error {
	return c.do(func() error { return c.reduce(ctx, send, recv, op, root) })
}

// Gather collects every rank's send (all of the same length m) into recv
// on root, rank i's at elements [i·m, (i+1)·m). recv is only used on root,
// and may hold root's send in place.
func (c *Communicator) Gather(ctx context.Context, send, recv Buffer, root int) error {
	return c.do(func() error { return c.gather(ctx, send, recv, root) })
}

// Scatter sends elements [i·m, (i+1)·m) of root's send to rank i's recv,
// m = recv.Len(). send is only used on root, where recv may be its block in
// place.
func (c *Communicator) Scatter(ctx context.Context, send, recv Buffer, root int) error {
	return c.do(func() error { return c.scatter(ctx, send, recv, root) })
}

// Barrier returns once every rank has entered it.
func (c *Communicator) Barrier(ctx context.Context) error {
	return c.do(func() error {
		cl := call{kind: kBarrier, dt: Float32}
		return c.collective(ctx, cl, nil, func(o *opState) error {
			if c.size == 1 {
				return nil
			}
			return o.rdAllReduce(Buffer{dt: Float32}, Sum)
		})
	})
}

// call is one operation as issued.
type call struct {
	name   string // for errors; kind.String() if empty
	kind   opKind
	dt     DType
	op     Op
	count  int
	root   int
	nbytes int       // the size that selects the algorithm
	alg    algorithm // the algorithm, when not picked by nbytes
	seq    uint64
	out    *header // the header to send, when not the one expected (send_recv)
	// Point-to-point calls, for the flight record: the peers (-1: none).
	p2p      bool
	to, from int
}

// collective numbers a collective and runs it.
func (c *Communicator) collective(ctx context.Context, cl call, verr error, body func(*opState) error) error {
	cl.seq = c.seq
	c.seq++
	return c.run(ctx, cl, verr, body)
}

// run executes one operation: it checks the communicator and the arguments
// (verr), frames the call, runs body under Options.Timeout and, on any
// failure, aborts the communicator.
func (c *Communicator) run(ctx context.Context, cl call, verr error, body func(*opState) error) error {
	if cl.name == "" {
		cl.name = cl.kind.String()
	}
	wrap := func(err error) error {
		return &OpError{Comm: c.opts.Name, Rank: c.rank, Op: cl.name, Seq: int64(cl.seq), Err: err}
	}
	if err := c.usable(); err != nil {
		return wrap(err)
	}
	id := c.flight.begin(&cl, cl.dt.Size())
	err := c.execute(ctx, cl, verr, body)
	c.flight.end(id, err)
	return err
}

// execute is run for a usable communicator.
func (c *Communicator) execute(ctx context.Context, cl call, verr error, body func(*opState) error) error {
	wrap := func(err error) error {
		return &OpError{Comm: c.opts.Name, Rank: c.rank, Op: cl.name, Seq: int64(cl.seq), Err: err}
	}
	if verr == nil {
		verr = ctx.Err()
	}
	if verr != nil { // the peers are entering the call: let them know now
		err := wrap(verr)
		c.abort(err)
		return err
	}
	alg := cl.alg
	if alg == algAuto {
		alg = c.pick(cl.kind, cl.nbytes)
	}
	octx, cancel := context.WithTimeoutCause(ctx, c.opts.Timeout, errOpTimeout)
	defer cancel()
	o := &opState{c: c, ctx: octx, alg: alg, want: header{
		kind: cl.kind, dt: cl.dt, op: cl.op, alg: alg, root: int32(cl.root),
		chunk: uint32(c.opts.ChunkBytes), seq: cl.seq, count: int64(cl.count),
	}}
	out := o.want
	if cl.out != nil {
		out = *cl.out
		out.chunk = o.want.chunk
	}
	out.encode(&o.hdr)
	clear(c.sent)
	clear(c.got)
	err := body(o)
	o.release()
	if err == nil {
		return nil
	}
	if c.isClosed() {
		err = ErrClosed
	}
	err = wrap(err)
	c.abort(err)
	return err
}

func (c *Communicator) allReduce(ctx context.Context, buf Buffer, op Op) error {
	cl := call{kind: kAllReduce, dt: buf.dt, op: op, count: buf.Len(), nbytes: len(buf.b)}
	verr := checkOp(op, buf)
	h, err := c.hierarchicalFor(ctx, partition{}, verr, len(buf.b))
	if err != nil {
		return err
	}
	if h != nil {
		cl.alg = algHier
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		switch {
		case c.size == 1:
			return nil
		case h != nil:
			return o.hierAllReduce(h, buf, op)
		case o.alg == algRing:
			return o.ringAllReduce(buf, op)
		case o.alg == algDirect:
			return o.progressAllReduce(c.shm, buf, op)
		}
		return o.allReduceSmall(o.alg, buf, op)
	})
}

func (c *Communicator) reduceScatter(ctx context.Context, send, recv Buffer, op Op) error {
	return c.reduceScatterIn(ctx, partition{send.Len(), c.size}, send, recv, op)
}

// reduceScatterIn is ReduceScatter with the blocks of q: Block's rule for
// the public call (which alone may go hierarchical), the hosts' for the
// levels of a hierarchical collective.
func (c *Communicator) reduceScatterIn(ctx context.Context, q blocks, send, recv Buffer, op Op) error {
	cl := call{kind: kReduceScatter, dt: send.dt, op: op, count: send.Len(), nbytes: len(send.b)}
	verr := errors.Join(checkOp(op, send), checkSame(send, recv),
		checkLen("recv", recv, q.count(c.rank)), checkBlock(send, recv, q.block(send, c.rank)))
	h, err := c.hierarchicalFor(ctx, q, verr, len(send.b))
	if err != nil {
		return err
	}
	if h != nil {
		cl.alg = algHier
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		switch {
		case c.size == 1:
			copyInto(recv, send)
			return nil
		case h != nil:
			return o.hierReduceScatter(h, send, recv, op)
		case o.alg == algRing:
			return o.ringReduceScatter(q, send, recv, o.scratch(slotWork, send.dt, send.Len()), op)
		case o.alg == algDirect:
			return o.progressReduceScatter(c.shm, q, send, recv, op)
		}
		work := o.scratch(slotCopy, send.dt, send.Len())
		copy(work.b, send.b)
		if err := o.allReduceSmall(o.alg, work, op); err != nil {
			return err
		}
		copyInto(recv, q.block(work, c.rank))
		return nil
	})
}

func (c *Communicator) allGather(ctx context.Context, kind opKind, send, recv Buffer) error {
	return c.allGatherIn(ctx, kind, partition{recv.Len(), c.size}, send, recv)
}

// allGatherIn is AllGather with the blocks of q (see reduceScatterIn).
func (c *Communicator) allGatherIn(ctx context.Context, kind opKind, q blocks, send, recv Buffer) error {
	mine := q.block(recv, c.rank)
	cl := call{kind: kind, dt: recv.dt, count: recv.Len(), nbytes: len(recv.b)}
	verr := errors.Join(checkDType(recv), checkSame(recv, send),
		checkLen("send", send, q.count(c.rank)), checkBlock(recv, send, mine))
	h, err := c.hierarchicalFor(ctx, q, verr, len(recv.b))
	if err != nil {
		return err
	}
	if h != nil {
		cl.alg = algHier
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		if h != nil {
			return o.hierAllGather(h, send, recv)
		}
		if o.alg == algRing && c.size > 1 {
			return o.ringAllGather(q, recv, send) // puts send in place itself
		}
		copyInto(mine, send)
		switch {
		case c.size == 1:
			return nil
		case o.alg == algDirect:
			return o.progressAllGather(c.shm, q, send, recv)
		}
		off := q.offset(c.rank) * recv.dt.Size()
		clear(recv.b[:off])
		clear(recv.b[off+len(mine.b):])
		return o.allReduceSmall(o.alg, recv, opBor)
	})
}

func (c *Communicator) broadcast(ctx context.Context, buf Buffer, root int) error {
	cl := call{kind: kBroadcast, dt: buf.dt, count: buf.Len(), root: root, nbytes: len(buf.b)}
	verr := errors.Join(checkDType(buf), c.checkRoot(root))
	return c.collective(ctx, cl, verr, func(o *opState) error {
		switch {
		case c.size == 1:
			return nil
		case o.alg == algRing:
			return o.chainBroadcast(root, buf)
		}
		return o.treeBroadcast(root, buf)
	})
}

func (c *Communicator) reduce(ctx context.Context, send, recv Buffer, op Op, root int) error {
	cl := call{kind: kReduce, dt: send.dt, op: op, count: send.Len(), root: root, nbytes: len(send.b)}
	verr := errors.Join(checkOp(op, send), c.checkRoot(root))
	if c.rank == root {
		verr = errors.Join(verr, checkSame(send, recv), checkLen("recv", recv, send.Len()), checkBlock(send, recv, send))
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		switch {
		case c.size == 1:
			copyInto(recv, send)
			return nil
		case o.alg == algRing:
			return o.ringReduce(root, send, recv, op)
		}
		return o.treeReduce(root, send, recv, op)
	})
}

func (c *Communicator) gather(ctx context.Context, send, recv Buffer, root int) error {
	m := send.Len()
	cl := call{kind: kGather, dt: send.dt, count: m, root: root}
	verr := errors.Join(checkDType(send), c.checkRoot(root))
	if c.rank == root {
		verr = errors.Join(verr, checkSame(send, recv), checkLen("recv", recv, c.size*m))
		if verr == nil {
			verr = checkBlock(recv, send, recv.Slice(root*m, (root+1)*m))
		}
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		if c.rank != root {
			return o.send(o.ctx, root, send)
		}
		var fns []func(context.Context) error
		for b := range c.size {
			dst := recv.Slice(b*m, (b+1)*m)
			if b == root {
				copyInto(dst, send)
				continue
			}
			fns = append(fns, func(ctx context.Context) error { return o.recv(ctx, b, dst) })
		}
		return par(o.ctx, fns...)
	})
}

func (c *Communicator) scatter(ctx context.Context, send, recv Buffer, root int) error {
	m := recv.Len()
	cl := call{kind: kScatter, dt: recv.dt, count: m, root: root}
	verr := errors.Join(checkDType(recv), c.checkRoot(root))
	if c.rank == root {
		verr = errors.Join(verr, checkSame(recv, send), checkLen("send", send, c.size*m))
		if verr == nil {
			verr = checkBlock(send, recv, send.Slice(root*m, (root+1)*m))
		}
	}
	return c.collective(ctx, cl, verr, func(o *opState) error {
		if c.rank != root {
			return o.recv(o.ctx, root, recv)
		}
		var fns []func(context.Context) error
		for b := range c.size {
			src := send.Slice(b*m, (b+1)*m)
			if b == root {
				copyInto(recv, src)
				continue
			}
			fns = append(fns, func(ctx context.Context) error { return o.send(ctx, b, src) })
		}
		return par(o.ctx, fns...)
	})
}

// Argument checks. Any of them failing aborts the communicator (the peers
// are already in the call): they catch programming errors.

func checkDType(b Buffer) error {
	if b.dt.Size() == 0 {
		return errors.New("buffer has no dtype (the zero Buffer?)")
	}
	return nil
}

func checkOp(op Op, b Buffer) error {
	if !op.valid() {
		return fmt.Errorf("invalid reduce op %v", op)
	}
	return checkDType(b)
}

func checkSame(a, b Buffer) error {
	if a.dt != b.dt {
		return fmt.Errorf("dtypes differ: %v and %v", a.dt, b.dt)
	}
	return nil
}

func checkLen(name string, b Buffer, want int) error {
	if b.Len() != want {
		return fmt.Errorf("%s has %d elements, want %d", name, b.Len(), want)
	}
	return nil
}

// checkBlock rejects small overlapping big anywhere but exactly at block
// (in place): MPI forbids aliased buffers otherwise.
func checkBlock(big, small, block Buffer) error {
	if overlaps(big, small) && !sameMem(small, block) {
		return errors.New("send and recv overlap, and not as the in-place block")
	}
	return nil
}

// checkRoot rejects a root outside the group.
func (c *Communicator) checkRoot(root int) error {
	if root < 0 || root >= c.size {
		return fmt.Errorf("root %d out of range for size %d", root, c.size)
	}
	return nil
}
