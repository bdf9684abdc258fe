package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The ring over TCP on one goroutine. With a goroutine sending and one
// receiving, every chunk is a hand-off between them (a channel send that
// wakes the other's thread) and every read that finds nothing parks in
// Go's network poller; a 2-rank all-gather of 64 KiB spent most of its
// 100 µs in the scheduler (futex wake-ups, thread switches, goroutine
// exits), not in the four syscalls it needs. So when both ring neighbours
// are single-connection TCP links, one goroutine drives both sockets
// without blocking: it writes what may be sent (the header and every
// chunk whose data is in, several messages in one writev), reads into the
// next chunk's buffer, reduces a chunk as soon as it is in, and when
// neither socket is ready waits in poll(2) on both, as Open MPI's tcp btl
// does. The wire format and the schedule are those of the two-goroutine
// ring (algorithms_ring.go), so ranks on either path interoperate.

// tcpPollWait bounds one poll(2): how late cancellation, the operation's
// deadline or Close of the link is noticed.
const tcpPollWait = 5 * time.Millisecond

// tcpWriteMax bounds one writev, so that reading (and reducing) what came
// in is not held up while a large batch goes out: on the veth pair it made
// 1-4 MiB all-gathers 1.2-1.4x faster than unbounded writes.
const tcpWriteMax = 256 << 10

// ringLinks returns the links of the ring pass when both are TCP links of
// one connection (striped links keep the two-goroutine ring).
func (o *opState) ringLinks() (in, out *tcpConn, ok bool) {
	p, r := o.c.size, o.c.rank
	in, ok1 := o.c.conns[mod(r-1, p)].(*tcpConn)
	out, ok2 := o.c.conns[mod(r+1, p)].(*tcpConn)
	if !ok1 || !ok2 || len(in.ncs) != 1 || len(out.ncs) != 1 {
		return nil, nil, false
	}
	return in, out, true
}

// tcpRecvItem is one message the ring receives: into dst directly, or into
// t, then reduced with local into dst.
type tcpRecvItem struct {
	dst, local, t Buffer
	reduce, avg   bool
}

// tcpRing is the state of one ring pass over TCP on one goroutine.
type tcpRing struct {
	o           *opState
	rp          *ringPass
	in, out     *tcpConn
	left, right int

	// sending: sends[i] is a message, lens its length prefixes; next is
	// the first not yet queued in wq, the bytes not yet written.
	sends   [][]byte
	lens    []byte
	hdrOut  bool // sends[0] is the header
	nFirst  int  // chunks that wait for no receive
	next    int
	wq      [][]byte
	wrote   int64
	hdrLeft int // bytes of the header message not yet written

	// receiving: recvs[got] is read into; off counts its bytes so far,
	// length prefix included.
	recvs  []tcpRecvItem
	hdrIn  bool // recvs[0] is the header
	got    int
	off    int
	lenIn  [8]byte
	readIn int64

	idle tcpIdle
}

// ringTCP runs the pass rp over in (from the left) and out (to the right).
func (o *opState) ringTCP(rp *ringPass, in, out *tcpConn) error {
	p, r := o.c.size, o.c.rank
	t := &tcpRing{o: o, rp: rp, in: in, out: out, left: mod(r-1, p), right: mod(r+1, p), idle: tcpIdle{tcpWaitConfig: in.wait, bo: &in.spinBo}}
	if t.idle.sys == nil {
		t.idle.sys = osTCPSys{}
	}
	t.plan()
	if len(t.sends) == 0 && len(t.recvs) == 0 {
		return nil
	}
	out.sendMu.Lock()
	defer out.sendMu.Unlock()
	in.recvMu.Lock()
	defer in.recvMu.Unlock()
	if err := in.precheck(o.ctx, in.recvErr); err != nil {
		return t.recvErr(err)
	}
	if err := out.precheck(o.ctx, out.sendErr); err != nil {
		return t.sendErr(err)
	}
	// The deadlines of an earlier call may have passed; this loop
	// watches ctx itself.
	in.ncs[0].SetReadDeadline(time.Time{})
	out.ncs[0].SetWriteDeadline(time.Time{})
	rcIn, err := in.ncs[0].SyscallConn()
	if err != nil {
		return t.recvErr(err)
	}
	rcOut, err := out.ncs[0].SyscallConn()
	if err != nil {
		return t.sendErr(err)
	}
	rerr := rcIn.Read(func(fdIn uintptr) bool {
		werr := rcOut.Write(func(fdOut uintptr) bool {
			err = t.loop(int(fdIn), int(fdOut))
			return true
		})
		if werr != nil {
			err = t.sendErr(werr)
		}
		return true
	})
	if rerr != nil {
		err = t.recvErr(rerr)
	}
	if err != nil {
		t.flushHeader()
		t.breakLinks()
	}
	return err
}

// plan lists the messages of the pass, in the order of the two-goroutine
// ring: the header to each neighbour once per call, then the chunks.
func (t *tcpRing) plan() {
	o, rp := t.o, t.rp
	p, r := o.c.size, o.c.rank
	n := o.chunkLen(rp.dt)
	if !o.c.sent[t.right] {
		o.c.sent[t.right] = true
		t.sends, t.hdrOut, t.hdrLeft = append(t.sends, o.hdr[:]), true, 8+hdrSize
	}
	if !o.c.got[t.left] {
		o.c.got[t.left] = true
		t.recvs, t.hdrIn = append(t.recvs, tcpRecvItem{dst: Buffer{b: o.c.hdrIn[t.left][:]}}), true
	}
	tmp := o.scratch(slotTmp, rp.dt, n)
	for s := rp.first; s <= rp.last; s++ {
		src := rp.src(s, mod(r-s-1, p))
		for lo := 0; lo < src.Len(); lo += n {
			t.sends = append(t.sends, src.Slice(lo, min(lo+n, src.Len())).b)
			if s == rp.first {
				t.nFirst++
			}
		}
		b := mod(r-s-2, p)
		dst := rp.dst(s, b)
		reducing := s < p-1
		for lo := 0; lo < dst.Len(); lo += n {
			hi := min(lo+n, dst.Len())
			it := tcpRecvItem{dst: dst.Slice(lo, hi)}
			if reducing {
				it.local, it.t, it.reduce = rp.local(b).Slice(lo, hi), tmp.Slice(0, hi-lo), true
				it.avg = rp.avg && s == p-2
			}
			t.recvs = append(t.recvs, it)
		}
	}
	t.lens = make([]byte, 8*len(t.sends))
	for i, m := range t.sends {
		binary.LittleEndian.PutUint64(t.lens[8*i:], uint64(len(m)))
	}
}

// sendable reports whether message i may go: the header and the first
// step's chunks at once, a later chunk once the chunk it forwards is in.
func (t *tcpRing) sendable(i int) bool {
	c := i
	if t.hdrOut {
		if c == 0 {
			return true
		}
		c--
	}
	in := t.got
	if t.hdrIn {
		in--
	}
	return c < t.nFirst || in > c-t.nFirst
}

// loop moves bytes until the pass is done, waiting in poll(2) when
// neither socket can.
func (t *tcpRing) loop(fdIn, fdOut int) error {
	for t.next < len(t.sends) || len(t.wq) > 0 || t.got < len(t.recvs) {
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
		if wrote || read {
			t.idle.moved()
		} else if err := t.wait(fdIn, fdOut); err != nil {
			return err
		}
	}
	return nil
}

// alive reports the operation's end or a closed link.
func (t *tcpRing) alive() error {
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

// write queues what may be sent and writes what the socket takes.
func (t *tcpRing) write(fd int) (bool, error) {
	for t.next < len(t.sends) && t.sendable(t.next) && len(t.wq) < 1022 {
		t.wq = append(t.wq, t.lens[8*t.next:8*t.next+8], t.sends[t.next])
		t.next++
	}
	if len(t.wq) == 0 {
		return false, nil
	}
	wq := tcpLimit(t.wq, tcpWriteMax)
	linkRaceRelease() // before the bytes can reach the peer (see link_race.go)
	m, err := unix.Writev(fd, wq)
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

// read reads into the message being received, and finishes it when whole.
func (t *tcpRing) read(fd int) (bool, error) {
	if t.got == len(t.recvs) {
		return false, nil
	}
	it := &t.recvs[t.got]
	target := it.dst.b
	if it.reduce {
		target = it.t.b
	}
	iov := [][]byte{t.lenIn[min(t.off, 8):], target[max(0, t.off-8):]}
	if t.off >= 8 {
		iov = iov[1:]
	}
	m, err := t.readv(fd, iov)
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
	if t.off == 8+len(target) {
		return true, t.finish(it)
	}
	return true, nil
}

// readv reads from what the link's reader already buffered (a Recv before
// this pass may have read ahead), else from the socket.
func (t *tcpRing) readv(fd int, iov [][]byte) (int, error) {
	if rd := t.in.rds[0]; rd.Buffered() > 0 {
		return rd.Read(iov[0])
	}
	return unix.Readv(fd, iov)
}

// finish completes a received message: checks the header, or reduces.
func (t *tcpRing) finish(it *tcpRecvItem) error {
	t.off = 0
	if t.hdrIn && t.got == 0 {
		t.got++
		return t.o.checkHeader(t.left)
	}
	if it.reduce {
		reduceInto(t.rp.op, it.dst, it.local, it.t)
		if it.avg {
			divide(it.dst, t.o.c.size)
		}
	}
	t.got++
	return nil
}

// wait gives a pass that found nothing to move a moment (see tcp_wait.go)
// or, once its spin budget is spent, blocks in poll(2) until a socket it
// needs is ready, or tcpPollWait passes.
func (t *tcpRing) wait(fdIn, fdOut int) error {
	var fds [2]unix.PollFd
	k := 0
	if t.got < len(t.recvs) {
		fds[k] = unix.PollFd{Fd: int32(fdIn), Events: unix.POLLIN}
		k++
		t.o.c.flight.wait(t.left)
	} else {
		t.o.c.flight.wait(t.right)
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

// recvErr is err on the link from the left, as the two-goroutine ring
// reports it: a peer that has not sent its header has not joined.
func (t *tcpRing) recvErr(err error) error {
	var me *MismatchError
	if errors.As(err, &me) {
		return err
	}
	err = t.in.fail(t.o.ctx, "recv", err)
	if t.hdrIn && t.got == 0 {
		return t.o.c.joinErr(t.o.ctx, t.left, err)
	}
	return t.o.c.peerErr(t.o.ctx, t.left, err)
}

func (t *tcpRing) sendErr(err error) error {
	err = t.out.fail(t.o.ctx, "send", err)
	if t.hdrOut && t.hdrLeft > 0 {
		return t.o.c.joinErr(t.o.ctx, t.right, err)
	}
	return t.o.c.peerErr(t.o.ctx, t.right, err)
}

// flushHeader finishes sending this call's header after a failure, so
// that a peer that called something else reports the mismatch too (as
// sendHeader's use of the operation's context does).
func (t *tcpRing) flushHeader() {
	if !t.hdrOut || t.hdrLeft == 0 || t.out.closed.Load() {
		return
	}
	msg := append(t.lens[:8:8], t.sends[0]...)
	stop := tcpWatch(t.o.ctx, t.out.ncs, (*net.TCPConn).SetWriteDeadline)
	m, _ := t.out.ncs[0].Write(msg[len(msg)-t.hdrLeft:])
	stop()
	t.wrote += int64(m)
	t.hdrLeft -= m
}

// breakLinks marks a link whose stream a failed pass left mid-message.
func (t *tcpRing) breakLinks() {
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

// tcpLimit returns the first at most n bytes of bufs.
func tcpLimit(bufs [][]byte, n int) [][]byte {
	for i, b := range bufs {
		if len(b) >= n {
			out := append([][]byte(nil), bufs[:i+1]...)
			out[i] = b[:n]
			return out
		}
		n -= len(b)
	}
	return bufs
}
