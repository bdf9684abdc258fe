package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A pass over TCP on one goroutine: the engine under the ring over TCP
// (algorithms_ring_tcp.go) and the exchanges of recursive doubling
// (algorithms_rd_tcp.go), on links whose stream runs on a descriptor of
// its own (tcp_fd.go). With a goroutine sending and one receiving,
// every chunk is a hand-off between them (a channel send that wakes the
// other's thread) and every read that finds nothing parks in Go's network
// poller; a 2-rank all-gather of 64 KiB spent most of its 100 µs in the
// scheduler (futex wake-ups, thread switches, goroutine exits), not in the
// four syscalls it needs. So a pass drives its two sockets (one, when it
// sends to and receives from the same peer) without blocking: it writes
// what may be sent (several messages in one writev, each a length and the
// bytes, as tcpConn.Send frames them), reads into the message being
// received, reduces what came in as soon as it may, and when neither
// socket is ready waits in poll(2) on both, as Open MPI's tcp btl does.
// What a pass sends and receives is the algorithm's: a list of messages
// to send, a rule for when each may go, and a list of messages to receive,
// each stored or reduced into its destination.

// tcpPollWait bounds one poll(2): how late cancellation, the operation's
// deadline or Close of the link is noticed.
const tcpPollWait = 5 * time.Millisecond

// tcpWriteMax bounds one writev, so that reading (and reducing) what came
// in is not held up while a large batch goes out: on the veth pair it made
// 1-4 MiB all-gathers 1.2-1.4x faster than unbounded writes.
const tcpWriteMax = 256 << 10

// tcpRecvItem is one message a pass receives: into dst directly, or into
// t, then reduced with local into dst (local ⊕ t, or t ⊕ local when swap,
// so that every rank combines in the same order). A guarded item's dst is
// also being sent: it is reduced only once the pass has written its
// bytes, that is wAt bytes and dst's length.
type tcpRecvItem struct {
	dst, local, t Buffer
	reduce, avg   bool
	swap, guard   bool
	wAt           int64
}

// tcpPass is the state of one pass over TCP on one goroutine.
type tcpPass struct {
	o        *opState
	in, out  *tcpConn
	from, to int // the peers in and out lead to
	op       Op  // of the reduced items

	// sending: sends[i] is a message, lens its length prefixes; next is
	// the first not yet queued in wq, the bytes not yet written.
	sends   [][]byte
	lens    []byte
	gated   bool // a message after the first nFirst waits for the one it forwards (the ring)
	nFirst  int
	window  int  // on the ring, first-step message i waits for item i-window (0: none waits)
	hdrOut  bool // sends[0] is the header
	next    int
	wq      [][]byte
	wqBase  [][]byte // wq's storage: wq starts here once it is empty
	lim     [][]byte // tcpLimit's
	wrote   int64
	hdrLeft int // bytes of the header message not yet written

	// receiving: recvs[got] is read into; off counts its bytes so far,
	// length prefix included. recvs[:done] are finished (stored or
	// reduced).
	recvs  []tcpRecvItem
	hdrIn  bool // recvs[0] is the header
	ownTmp bool // each item reads into a t of its own: reading may run ahead of reducing
	got    int
	off    int
	done   int
	lenIn  [8]byte
	readIn int64

	idle tcpIdle
	fds  [2]unix.PollFd // wait's

	// fillSrc is copied into fillDst (the same length) in pieces while
	// neither socket can move, and the rest once every message is done:
	// an out-of-place all-gather's own block, so that its copy overlaps
	// the network instead of coming before it. fillOff counts the bytes
	// copied.
	fillDst, fillSrc []byte
	fillOff          int
}

// tcpFillPiece is what one idle moment of a pass copies of its fill: about
// a µs of copying, well under tcpLookGap.
const tcpFillPiece = 16 << 10

// newTCPPass starts a pass from peer from over in to peer to over out
// (the same link for an exchange with one peer). A communicator runs one
// operation at a time and an operation one pass at a time, so the pass is
// the communicator's, its lists kept from call to call: a collective over
// TCP allocates no memory for them, and the garbage collector, which on a
// rank pinned to one core stalled calls by 0.4-1.4 ms (the collection and
// the first touch of the heap the calls grew; docs/benchmarks.md), runs
// that much less often.
func (o *opState) newTCPPass(from, to int, in, out *tcpConn) *tcpPass {
	t := &o.c.pass
	t.reset()
	t.o, t.in, t.out, t.from, t.to = o, in, out, from, to
	t.idle = tcpIdle{tcpWaitConfig: in.wait, bo: &in.spinBo}
	if t.idle.sys == nil {
		t.idle.sys = osTCPSys{}
	}
	return t
}

// tcpPassKeep bounds the lists a pass keeps for the next: 4096 messages
// is a 1 GiB buffer's in 256 KiB chunks.
const tcpPassKeep = 4096

// reset clears the pass for the next, keeping its lists' storage (up to
// tcpPassKeep) and no reference to this one's buffers, links or operation.
func (t *tcpPass) reset() {
	*t = tcpPass{sends: keepList(t.sends), lens: t.lens[:0], wqBase: keepList(t.wqBase),
		lim: keepList(t.lim), recvs: keepList(t.recvs)}
	t.wq = t.wqBase
}

// keepList empties s for reuse, its storage cleared of references, or
// drops it when it is longer than tcpPassKeep.
func keepList[T any](s []T) []T {
	if cap(s) > tcpPassKeep {
		return nil
	}
	clear(s[:cap(s)])
	return s[:0]
}

// header queues this operation's header to and from the peers, once per
// call, as sendHeader and recvHeader do; call it before adding messages.
func (t *tcpPass) header() {
	o := t.o
	if !o.c.sent[t.to] {
		o.c.sent[t.to] = true
		t.sends, t.hdrOut, t.hdrLeft = append(t.sends, o.hdr[:]), true, 8+hdrSize
	}
	if !o.c.got[t.from] {
		o.c.got[t.from] = true
		t.recvs, t.hdrIn = append(t.recvs, tcpRecvItem{dst: Buffer{b: o.c.hdrIn[t.from][:]}}), true
	}
}

// run moves every message of the pass.
func (t *tcpPass) run() error {
	defer t.reset()
	if len(t.sends) == 0 && len(t.recvs) == 0 {
		t.fill(len(t.fillSrc))
		return nil
	}
	t.lens = slices.Grow(t.lens[:0], 8*len(t.sends))[:8*len(t.sends)]
	for i, m := range t.sends {
		binary.LittleEndian.PutUint64(t.lens[8*i:], uint64(len(m)))
	}
	in, out := t.in, t.out
	out.sendMu.Lock()
	defer out.sendMu.Unlock()
	in.recvMu.Lock()
	defer in.recvMu.Unlock()
	if err := in.precheck(t.o.ctx, in.recvErr); err != nil {
		return t.recvErr(err)
	}
	if err := out.precheck(t.o.ctx, out.sendErr); err != nil {
		return t.sendErr(err)
	}
	err := t.loop(in.sock, out.sock)
	if err != nil {
		t.flushHeader()
		t.breakLinks()
	}
	return err
}

// loop moves bytes until the pass is done, waiting in poll(2) when
// neither socket can.
func (t *tcpPass) loop(fdIn, fdOut int) error {
	for t.next < len(t.sends) || len(t.wq) > 0 || t.done < len(t.recvs) {
		if err := t.alive(); err != nil {
			return err
		}
		wrote, err := t.write(fdOut)
		if err != nil {
			return t.sendErr(err)
		}
		read, err := t.read(fdIn)
		if err != nil {
			return err
		}
		t.advance()
		switch {
		case wrote || read:
			t.idle.moved()
		case t.fill(tcpFillPiece):
			// nothing to move: a piece of the fill instead of a look
		default:
			if err := t.wait(fdIn, fdOut); err != nil {
				return err
			}
		}
	}
	t.fill(len(t.fillSrc))
	return nil
}

// fill copies up to n more bytes of fillSrc into fillDst; false when all
// are copied.
func (t *tcpPass) fill(n int) bool {
	if t.fillOff >= len(t.fillSrc) {
		return false
	}
	hi := min(t.fillOff+n, len(t.fillSrc))
	copy(t.fillDst[t.fillOff:hi], t.fillSrc[t.fillOff:hi])
	t.fillOff = hi
	return true
}

// alive reports the operation's end or a closed link.
func (t *tcpPass) alive() error {
	switch {
	case t.in.closed.Load():
		return t.recvErr(ErrLinkClosed)
	case t.out.closed.Load():
		return t.sendErr(ErrLinkClosed)
	case t.o.ctx.Err() != nil && t.got < len(t.recvs):
		return t.recvErr(context.Cause(t.o.ctx))
	case t.o.ctx.Err() != nil:
		return t.sendErr(context.Cause(t.o.ctx))
	}
	return nil
}

// sendable reports whether message i may go with done items finished:
// any at once, or on the ring the header at once, the first step's chunks
// once all but window of those before them have been matched by a chunk
// received (tcpRingWindow), and a later chunk once the chunk it forwards
// is in.
func (t *tcpPass) sendable(i, done int) bool {
	if !t.gated {
		return true
	}
	if t.hdrOut {
		if i == 0 {
			return true
		}
		i--
	}
	if t.hdrIn {
		done--
	}
	if i < t.nFirst {
		return t.window == 0 || done > i-t.window
	}
	return done > i-t.nFirst
}

// write queues what may be sent and writes what the socket takes.
func (t *tcpPass) write(fd int) (bool, error) {
	if len(t.wq) == 0 {
		t.wq = t.wqBase[:0]
	}
	for t.next < len(t.sends) && t.sendable(t.next, t.done) && len(t.wq) < 1022 {
		t.wq = append(t.wq, t.lens[8*t.next:8*t.next+8], t.sends[t.next])
		if cap(t.wq) > cap(t.wqBase) { // grown: keep the new storage
			t.wqBase = t.wq[:0]
		}
		t.next++
	}
	if len(t.wq) == 0 {
		return false, nil
	}
	wq := tcpLimit(t.wq, tcpWriteMax, &t.lim)
	linkRaceRelease() // before the bytes can reach the peer (see link_race.go)
	m, err := writev(fd, wq)
	switch {
	case m > 0:
		t.wrote += int64(m)
		t.hdrLeft = max(0, t.hdrLeft-m)
		t.wq = tcpConsume(t.wq, m)
		return true, nil
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return false, nil
	}
	return false, os.NewSyscallError("writev", err)
}

// read reads into the message being received, and counts it in when
// whole. It does not start a message before the ones before it are
// finished unless each has a buffer of its own.
func (t *tcpPass) read(fd int) (bool, error) {
	if t.got == len(t.recvs) || (!t.ownTmp && t.done < t.got) {
		return false, nil
	}
	it := &t.recvs[t.got]
	target := it.target()
	iov := [][]byte{t.lenIn[min(t.off, 8):], target[max(0, t.off-8):]}
	if t.off >= 8 {
		iov = iov[1:]
	}
	m, err := readv(fd, iov)
	switch {
	case m > 0:
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return false, nil
	case err != nil:
		return false, t.recvErr(os.NewSyscallError("readv", err))
	default:
		return false, t.recvErr(io.EOF)
	}
	before := t.off
	t.off += m
	t.readIn += int64(m)
	if before < 8 && t.off >= 8 {
		linkRaceAcquire() // the sender released before its first byte: see link_race.go
		if n := binary.LittleEndian.Uint64(t.lenIn[:]); n != uint64(len(target)) {
			return false, t.recvErr(fmt.Errorf("%w: got a message of %d bytes, want %d (the ranks disagree about the call)", ErrMessageLength, n, len(target)))
		}
	}
	if t.off < 8+len(target) {
		return true, nil
	}
	t.off = 0
	t.got++
	if t.hdrIn && t.got == 1 {
		return true, t.o.checkHeader(t.from)
	}
	return true, nil
}

// target is where the item's bytes are read to.
func (it *tcpRecvItem) target() []byte {
	if it.reduce {
		return it.t.b
	}
	return it.dst.b
}

// advance finishes what came in, in order: stores need nothing more, a
// reduction runs once the whole message is in and, for a guarded item,
// its own bytes have gone out.
func (t *tcpPass) advance() {
	for ; t.done < t.got; t.done++ {
		it := &t.recvs[t.done]
		if !it.reduce {
			continue
		}
		if it.guard && t.wrote < it.wAt+int64(len(it.dst.b)) {
			return
		}
		a, b := it.local, it.t
		if it.swap {
			a, b = b, a
		}
		reduceInto(t.op, it.dst, a, b)
		if it.avg {
			divide(it.dst, t.o.c.size)
		}
	}
}

// wait gives a pass that found nothing to move a moment (see tcp_wait.go)
// or, once its spin budget is spent, blocks in poll(2) until a socket it
// needs is ready, or tcpPollWait passes.
func (t *tcpPass) wait(fdIn, fdOut int) error {
	fds := &t.fds
	k := 0
	if t.got < len(t.recvs) {
		fds[k] = unix.PollFd{Fd: int32(fdIn), Events: unix.POLLIN}
		k++
		t.o.c.flight.wait(t.from)
	} else {
		t.o.c.flight.wait(t.to)
	}
	if t.idle.spin() {
		return nil
	}
	if len(t.wq) > 0 {
		if k == 1 && fdIn == fdOut {
			fds[0].Events |= unix.POLLOUT
		} else {
			fds[k] = unix.PollFd{Fd: int32(fdOut), Events: unix.POLLOUT}
			k++
		}
	}
	wait := tcpPollWait
	if dl, ok := t.o.ctx.Deadline(); ok {
		wait = min(wait, max(time.Until(dl), 0))
	}
	if err := t.idle.sys.poll(fds[:k], wait); err != nil {
		return t.recvErr(err)
	}
	return nil
}

// recvErr is err on the link from the peer before, as the two-goroutine
// algorithms report it: a peer that has not sent its header has not
// joined.
func (t *tcpPass) recvErr(err error) error {
	var me *MismatchError
	if errors.As(err, &me) {
		return err
	}
	err = t.in.fail(t.o.ctx, "recv", err)
	if t.hdrIn && t.got == 0 {
		return t.o.c.joinErr(t.o.ctx, t.from, err)
	}
	return t.o.c.peerErr(t.o.ctx, t.from, err)
}

func (t *tcpPass) sendErr(err error) error {
	err = t.out.fail(t.o.ctx, "send", err)
	if t.hdrOut && t.hdrLeft > 0 {
		return t.o.c.joinErr(t.o.ctx, t.to, err)
	}
	return t.o.c.peerErr(t.o.ctx, t.to, err)
}

// flushHeader finishes sending this call's header after a failure, so
// that a peer that called something else reports the mismatch too (as
// sendHeader's use of the operation's context does).
func (t *tcpPass) flushHeader() {
	if !t.hdrOut || t.hdrLeft == 0 || t.out.closed.Load() {
		return
	}
	msg := append(t.lens[:8:8], t.sends[0]...)
	m, _ := t.out.writeFD(t.o.ctx, [][]byte{msg[len(msg)-t.hdrLeft:]})
	t.wrote += int64(m)
	t.hdrLeft -= m
}

// breakLinks marks a link whose stream a failed pass left mid-message.
func (t *tcpPass) breakLinks() {
	if t.off > 0 || (t.readIn > 0 && t.got < len(t.recvs)) {
		t.in.recvErr = ErrLinkBroken
	}
	if t.wrote > 0 && (len(t.wq) > 0 || t.next < len(t.sends)) {
		t.out.sendErr = ErrLinkBroken
	}
}

// tcpConsume drops the first n bytes of bufs, and the buffers emptied.
func tcpConsume(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// tcpWriteSlack is how far past its bound n a write of tcpLimit goes
// rather than leave less than this of the buffer it cuts, or of the whole
// queue, to a write of its own: a 256 KiB chunk after its 8-byte length
// (and the operation's header) would otherwise go as one write of 256 KiB
// and one of the 8 to 56 bytes over, a segment of their own that the
// receiver needs before the chunk is whole.
const tcpWriteSlack = 4 << 10

// tcpLimit returns the first at most n bytes of bufs, or up to
// tcpWriteSlack more where that ends the buffer it would cut or all of
// bufs. A cut list is made in *into's storage when into is not nil.
func tcpLimit(bufs [][]byte, n int, into *[][]byte) [][]byte {
	total := 0
	for _, b := range bufs {
		if total += len(b); total > n+tcpWriteSlack {
			break
		}
	}
	if total <= n+tcpWriteSlack {
		return bufs
	}
	for i, b := range bufs {
		if len(b) >= n {
			if len(b)-n < tcpWriteSlack {
				n = len(b)
			}
			var s [][]byte
			if into != nil {
				s = *into
			}
			out := append(s[:0], bufs[:i+1]...)
			out[i] = b[:n]
			if into != nil {
				*into = out[:0]
			}
			return out
		}
		n -= len(b)
	}
	return bufs
}
