//go:build linux

package comm

import "errors"

// A streamed collective moves data in up to two phases per link. In: rank
// r sends its contribution to block j to rank j, and reduces block r chunk
// by chunk as every peer's chunk arrives (in rank order r+1, r+2, ..., so
// the result does not depend on timing). Out: rank r sends its finished
// block to every peer (each chunk as soon as it is finished), and copies
// each peer's into place as it comes.
//
// On a link the two phases interleave: the in chunks lead the out chunks
// by shmStreamLead (in 0, in 1, out 0, in 2, out 1, ...; see streamIn), so
// that a peer's finished chunk is copied into place soon after this rank
// sent its own part of that block, while that part of the buffer is still
// in the core's L2, and the peer's chunk soon after the peer wrote it. Out
// chunks used to queue behind all in chunks on the same ring: from 1 MiB
// up, buffer and rings (3 MiB a rank) no longer fit the 1 MiB L2, and the
// copy out wrote to buffer lines long evicted. Interleaved with Open MPI,
// 2 ranks in 2 processes, best times fell 3-15% at 1-8 MiB (the most at
// 8 MiB), and with the idle wait of idler.alone 18-47% at 16-256 MiB
// (docs/benchmarks.md, issue 19).
type stream struct {
	dt      DType
	q       blocks             // the blocks
	contrib func(j int) Buffer // this rank's contribution to block j; nil: no in phase
	acc     Buffer             // block r, holding this rank's own contribution, reduced in place
	op      Op
	fin     Buffer             // what this rank sends in the out phase
	dst     func(j int) Buffer // where rank j's finished block goes; nil: no out phase
}

// shmStreamLead is how many in chunks a link carries before its first out
// chunk, and how far they stay ahead: 2 lets a peer's next part arrive
// while this rank reduces the current one (1 and 3 measured no better).
const shmStreamLead = 2

// streamIn reports whether the next message on a link is an in chunk,
// after in and out messages of nIn and nOut: both ends of the link compute
// the same order.
func streamIn(in, out, nIn, nOut int) bool {
	return in < nIn && (out == nOut || in < out+shmStreamLead)
}

// streamHook, when set (by tests), is told of every chunk this rank
// reduces ("reduce", chunk of block r) and copies in ("copy", peer j's
// chunk).
var streamHook func(rank int, event string, j, chunk int)

// streamRun is the state of one streamed collective on one rank.
type streamRun struct {
	o       *opState
	links   []*shmConn
	s       stream
	p, r    int
	cl      int // elements per chunk
	mine    int // chunks of block r
	reduced int // chunks of block r finished
	// Per peer j: in and out chunks sent to j, out chunks copied in from j
	// (the in chunks received from j are reduced).
	sentIn, sentOut, gotOut []int
}

// nch is the number of chunks of block j.
func (t *streamRun) nch(j int) int { return (t.s.q.count(j) + t.cl - 1) / t.cl }

func (t *streamRun) chunk(b Buffer, c int) Buffer {
	return b.Slice(c*t.cl, min((c+1)*t.cl, b.Len()))
}

// nIn is the number of in chunks for block j; nOut the out chunks of
// block j.
func (t *streamRun) nIn(j int) int {
	if t.s.contrib == nil {
		return 0
	}
	return t.nch(j)
}

func (t *streamRun) nOut(j int) int {
	if t.s.dst == nil {
		return 0
	}
	return t.nch(j)
}

// post sends peer j what the link's order allows and has room for: its
// next in chunk, or the next finished chunk of block r once it is.
func (t *streamRun) post(j int) (bool, error) {
	progress := false
	for {
		var b Buffer
		in := streamIn(t.sentIn[j], t.sentOut[j], t.nIn(j), t.nOut(t.r))
		switch {
		case in:
			b = t.chunk(t.s.contrib(j), t.sentIn[j])
		case t.sentOut[j] < min(t.reduced, t.nOut(t.r)):
			b = t.chunk(t.s.fin, t.sentOut[j])
		default:
			return progress, nil
		}
		ok, err := t.links[j].tryPost(b.b)
		if err != nil {
			return false, t.o.c.peerErr(t.o.ctx, j, err)
		}
		if !ok {
			return progress, nil
		}
		if in {
			t.sentIn[j]++
		} else {
			t.sentOut[j]++
		}
		progress = true
	}
}

// outNext reports whether the next message from peer j is an out chunk.
func (t *streamRun) outNext(j int) bool {
	return t.gotOut[j] < t.nOut(j) && !streamIn(t.reduced, t.gotOut[j], t.nIn(t.r), t.nOut(j))
}

// copyIn copies into place the finished chunks of peer j that are next
// on its link.
func (t *streamRun) copyIn(j int) (bool, error) {
	progress := false
	for t.outNext(j) {
		dst := t.chunk(t.s.dst(j), t.gotOut[j])
		a, b, ok, err := t.links[j].peek(len(dst.b))
		if err != nil {
			return false, t.o.c.peerErr(t.o.ctx, j, err)
		}
		if !ok {
			break
		}
		ringCopy(dst.b, a)
		ringCopy(dst.b[len(a):], b)
		t.links[j].consume(len(dst.b))
		if streamHook != nil {
			streamHook(t.r, "copy", j, t.gotOut[j])
		}
		t.gotOut[j]++
		progress = true
	}
	return progress, nil
}

// ready reports whether every peer's part of the next chunk of block r is
// next on its link and has arrived.
func (t *streamRun) ready(n int) (bool, error) {
	for k := 1; k < t.p; k++ {
		j := (t.r + k) % t.p
		if t.outNext(j) {
			return false, nil
		}
		_, _, ok, err := t.links[j].peek(n)
		if err != nil {
			return false, t.o.c.peerErr(t.o.ctx, j, err)
		}
		if !ok {
			return false, nil
		}
		t.links[j].unpeek()
	}
	return true, nil
}

// reduce finishes the next chunk of block r once it is ready, reducing
// straight out of the rings.
func (t *streamRun) reduce() (bool, error) {
	if t.reduced == t.mine {
		return false, nil
	}
	dst := t.chunk(t.s.acc, t.reduced)
	if ok, err := t.ready(len(dst.b)); !ok || err != nil {
		return false, err
	}
	es := t.s.dt.Size()
	for k := 1; k < t.p; k++ {
		j := (t.r + k) % t.p
		a, b, ok, err := t.links[j].peek(len(dst.b))
		if !ok { // only Close can take a waiting message away
			return false, t.o.c.peerErr(t.o.ctx, j, errors.Join(err, ErrLinkClosed))
		}
		na := len(a) / es
		reduceInto(t.s.op, dst.Slice(0, na), dst.Slice(0, na), Buffer{b: a, dt: t.s.dt})
		if len(b) > 0 {
			reduceInto(t.s.op, dst.Slice(na, dst.Len()), dst.Slice(na, dst.Len()), Buffer{b: b, dt: t.s.dt})
		}
		t.links[j].consume(len(dst.b))
	}
	if t.s.op == Avg {
		divide(dst, t.p)
	}
	if streamHook != nil {
		streamHook(t.r, "reduce", t.r, t.reduced)
	}
	t.reduced++
	return true, nil
}

func (t *streamRun) done() bool {
	if t.reduced < t.mine {
		return false
	}
	for k := 1; k < t.p; k++ {
		j := (t.r + k) % t.p
		if t.sentIn[j] < t.nIn(j) || t.sentOut[j] < t.nOut(t.r) || t.gotOut[j] < t.nOut(j) {
			return false
		}
	}
	return true
}

// turn does what can be done now: send, copy in, reduce one chunk (whose
// finished chunk the next turn sends first).
func (t *streamRun) turn() (bool, error) {
	progress := false
	for k := 1; k < t.p; k++ {
		ok, err := t.post((t.r + k) % t.p)
		if err != nil {
			return false, err
		}
		progress = progress || ok
	}
	for k := 1; k < t.p; k++ {
		ok, err := t.copyIn((t.r - k + t.p) % t.p)
		if err != nil {
			return false, err
		}
		progress = progress || ok
	}
	ok, err := t.reduce()
	return progress || ok, err
}

// progress runs a streamed collective over shared-memory links (links[j]
// for every peer j) from one goroutine.
func (o *opState) progress(links []*shmConn, s stream) error {
	p, r := o.c.size, o.c.rank
	for k := 1; k < p; k++ {
		if err := o.sendHeader((r + k) % p); err != nil {
			return err
		}
	}
	for k := 1; k < p; k++ {
		if err := o.recvHeader(o.ctx, (r-k+p)%p); err != nil {
			return err
		}
	}
	// A chunk is at most an eighth of the ring, so that the in chunks a
	// link leads with and a few out chunks fit at once: 128 KiB with the
	// default ring (256 KiB took 3-6% longer at 2-8 MiB, 32 and 64 KiB no
	// less; smaller rings were slower, as before).
	cl := max(1, min(o.chunkLen(s.dt), int(links[(r+1)%p].tx.size)/8/s.dt.Size()))
	t := &streamRun{o: o, links: links, s: s, p: p, r: r, cl: cl,
		sentIn: make([]int, p), sentOut: make([]int, p), gotOut: make([]int, p)}
	t.mine = t.nch(r)
	if s.contrib == nil {
		t.reduced = t.mine
	}
	idle := idler{alone: true}
	for {
		progress, err := t.turn()
		if err != nil {
			return err
		}
		if t.done() {
			return nil
		}
		if progress {
			idle.reset()
			continue
		}
		if err := o.progressCheck(links, idle.n, func(j int) bool {
			return t.reduced < t.mine || t.gotOut[j] < t.nOut(j)
		}); err != nil {
			return err
		}
		if !idle.wait() {
			shmNapPoll()
		}
	}
}
