package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// The direct algorithms, for groups whose ranks all share one host: every
// rank works with every other at once instead of passing blocks around a
// ring, and moves each byte once. Reduce-scatter: rank r reduces block r
// itself, reading each peer's block r straight out of the peer's buffer
// (cross-memory attach, shm_cma.go) into a cache-sized scratch chunk and
// folding it in; over a link that cannot read the peer, the peer pushes
// the block as messages instead. All-gather: rank r copies each peer's
// block into its own buffer the same way. An all-reduce is the two, the
// reduced blocks staying in place between them.
//
// Links that read directly carry three 8-byte control messages per
// operation: the buffer's address; "my block is reduced" (all-reduce
// only), before which no peer reads it; and "I have finished reading",
// before which no rank returns, so no rank changes a buffer a peer still
// reads. Rank r takes peers in the order r-1, r-2, ... and pushes in the
// order r+1, r+2, ..., so at every round each rank sends to the rank that
// receives from it, and pushed transfers never wait in a cycle.

// peerReader is a link that can copy from the peer process's memory.
type peerReader interface {
	CanReadPeer() bool
	ReadPeer(dst []byte, addr uint64) error
}

// ctl values, checked on receipt.
const (
	ctlDone   = 1
	ctlFinish = 2
)

// allLinksRead reports whether every link reads its peer's memory
// directly: every rank on this host, and every process able to (see
// shm_cma.go). Every rank of a group gets the same answer: a rank on
// another host, or a process that cannot read, makes some link of every
// other rank fail the test too.
func allLinksRead(conns []Conn) bool {
	n := 0
	for _, cn := range conns {
		if cn == nil {
			continue
		}
		if pr, ok := cn.(peerReader); !ok || !pr.CanReadPeer() {
			return false
		}
		n++
	}
	return n > 0
}

// readers returns, per peer, the link if it reads the peer directly, else
// nil (the peer pushes).
func (o *opState) readers() []peerReader {
	rs := make([]peerReader, o.c.size)
	for j, cn := range o.c.conns {
		if pr, ok := cn.(peerReader); ok && j != o.c.rank && pr.CanReadPeer() {
			rs[j] = pr
		}
	}
	return rs
}

func addrOf(b Buffer) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b.b)))) }

func (o *opState) ctlSend(peer int, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return o.send(o.ctx, peer, Buffer{b: b[:], dt: Float32})
}

func (o *opState) ctlRecv(peer int, want uint64) (uint64, error) {
	var b [8]byte
	if err := o.recv(o.ctx, peer, Buffer{b: b[:], dt: Float32}); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(b[:])
	if want != 0 && v != want {
		world, host := o.c.describe(peer)
		return 0, &MismatchError{Peer: peer, World: world, Host: host, PeerOp: o.want.kind.String(),
			Detail: fmt.Sprintf("sent control word %d, not %d: the ranks are out of step", v, want)}
	}
	return v, nil
}

// swapAddrs tells every reading peer where b is and learns where theirs is.
func (o *opState) swapAddrs(rs []peerReader, b Buffer) ([]uint64, error) {
	p, r := o.c.size, o.c.rank
	addrs := make([]uint64, p)
	for k := 1; k < p; k++ {
		if j := (r + k) % p; rs[j] != nil {
			if err := o.ctlSend(j, addrOf(b)); err != nil {
				return nil, err
			}
		}
	}
	for k := 1; k < p; k++ {
		if j := (r - k + p) % p; rs[j] != nil {
			v, err := o.ctlRecv(j, 0)
			if err != nil {
				return nil, err
			}
			addrs[j] = v
		}
	}
	return addrs, nil
}

// signal sends v to every reading peer.
func (o *opState) signal(rs []peerReader, v uint64) error {
	p, r := o.c.size, o.c.rank
	for k := 1; k < p; k++ {
		if j := (r + k) % p; rs[j] != nil {
			if err := o.ctlSend(j, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish says this rank is done reading and waits until every reading
// peer says the same.
func (o *opState) finish(rs []peerReader) error {
	if err := o.signal(rs, ctlFinish); err != nil {
		return err
	}
	p, r := o.c.size, o.c.rank
	for k := 1; k < p; k++ {
		if j := (r - k + p) % p; rs[j] != nil {
			if _, err := o.ctlRecv(j, ctlFinish); err != nil {
				return err
			}
		}
	}
	return nil
}

// pushAll sends push(j) to every peer that does not read directly, in the
// order r+1, r+2, ...
func (o *opState) pushAll(ctx context.Context, rs []peerReader, push func(j int) Buffer) error {
	p, r := o.c.size, o.c.rank
	for k := 1; k < p; k++ {
		if j := (r + k) % p; rs[j] == nil {
			if err := o.send(ctx, j, push(j)); err != nil {
				return err
			}
		}
	}
	return nil
}

// withPushes runs pull on this goroutine and, when some peer does not
// read directly, pushAll alongside it.
func (o *opState) withPushes(rs []peerReader, push func(j int) Buffer, pull func(ctx context.Context) error) error {
	for j, pr := range rs {
		if pr == nil && j != o.c.rank {
			return par(o.ctx, pull, func(ctx context.Context) error { return o.pushAll(ctx, rs, push) })
		}
	}
	return pull(o.ctx)
}

// directReduce folds every peer's block r into out, which holds this
// rank's own contribution: read from peer j at addrs[j]+off, or received
// from it. push(j) is what this rank contributes to peer j's block.
func (o *opState) directReduce(rs []peerReader, addrs []uint64, off uint64, out Buffer, op Op, push func(j int) Buffer) error {
	p, r := o.c.size, o.c.rank
	n := o.chunkLen(out.dt)
	es := uint64(out.dt.Size())
	tmp := o.scratch(slotTmp, out.dt, n)
	return o.withPushes(rs, push, func(ctx context.Context) error {
		for k := 1; k < p; k++ {
			j := (r - k + p) % p
			if rs[j] == nil {
				if err := o.recvHeader(ctx, j); err != nil {
					return err
				}
			}
			for lo := 0; lo < out.Len(); lo += n {
				hi := min(lo+n, out.Len())
				t := tmp.Slice(0, hi-lo)
				if rs[j] != nil {
					if err := rs[j].ReadPeer(t.b, addrs[j]+off+uint64(lo)*es); err != nil {
						return o.c.peerErr(o.ctx, j, err)
					}
				} else if err := o.recvRaw(ctx, j, t); err != nil {
					return err
				}
				reduceInto(op, out.Slice(lo, hi), out.Slice(lo, hi), t)
			}
		}
		return nil
	})
}

// directGather fills dst(j) with every peer j's block: read at
// addrs[j]+off(j) (after the peer's "done" when waitDone), or received.
// mine is what this rank pushes to the peers that do not read.
func (o *opState) directGather(rs []peerReader, addrs []uint64, off func(j int) uint64, dst func(j int) Buffer, mine Buffer, waitDone bool) error {
	p, r := o.c.size, o.c.rank
	return o.withPushes(rs, func(int) Buffer { return mine }, func(ctx context.Context) error {
		for k := 1; k < p; k++ {
			j := (r - k + p) % p
			if rs[j] == nil {
				if err := o.recv(ctx, j, dst(j)); err != nil {
					return err
				}
				continue
			}
			if waitDone {
				if _, err := o.ctlRecv(j, ctlDone); err != nil {
					return err
				}
			}
			if err := rs[j].ReadPeer(dst(j).b, addrs[j]+off(j)); err != nil {
				return o.c.peerErr(o.ctx, j, err)
			}
		}
		return nil
	})
}

// directAllReduce all-reduces buf in place: reduce block r, announce it,
// gather the others' reduced blocks. Over shared-memory links only, it
// streams through the rings from one goroutine instead (shm_progress.go),
// which measured faster than reading peers' memory at every size.
func (o *opState) directAllReduce(buf Buffer, op Op) error {
	if links := shmLinks(o.c.conns); links != nil {
		return o.progressAllReduce(links, buf, op)
	}
	p, r := o.c.size, o.c.rank
	q := partition{buf.Len(), p}
	es := uint64(buf.dt.Size())
	blockOff := func(j int) uint64 { return uint64(q.offset(j)) * es }
	at := func(j int) Buffer { return q.block(buf, j) }
	rs := o.readers()
	addrs, err := o.swapAddrs(rs, buf)
	if err != nil {
		return err
	}
	mine := at(r)
	if err := o.directReduce(rs, addrs, blockOff(r), mine, op, at); err != nil {
		return err
	}
	if op == Avg {
		divide(mine, p)
	}
	if err := o.signal(rs, ctlDone); err != nil {
		return err
	}
	if err := o.directGather(rs, addrs, blockOff, at, mine, true); err != nil {
		return err
	}
	return o.finish(rs)
}

// directReduceScatter leaves block r of the reduction of in in out (which
// may be in's block r).
func (o *opState) directReduceScatter(in, out Buffer, op Op) error {
	p, r := o.c.size, o.c.rank
	q := partition{in.Len(), p}
	rs := o.readers()
	addrs, err := o.swapAddrs(rs, in)
	if err != nil {
		return err
	}
	copyInto(out, q.block(in, r))
	off := uint64(q.offset(r) * in.dt.Size())
	if err := o.directReduce(rs, addrs, off, out, op, func(j int) Buffer { return q.block(in, j) }); err != nil {
		return err
	}
	if op == Avg {
		divide(out, p)
	}
	return o.finish(rs)
}

// directAllGather fills out with every rank's block from send (which may
// be out's block r, already in place).
func (o *opState) directAllGather(send, out Buffer) error {
	q := partition{out.Len(), o.c.size}
	rs := o.readers()
	addrs, err := o.swapAddrs(rs, send)
	if err != nil {
		return err
	}
	at := func(j int) Buffer { return q.block(out, j) }
	if err := o.directGather(rs, addrs, func(int) uint64 { return 0 }, at, send, false); err != nil {
		return err
	}
	return o.finish(rs)
}
