package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A link of one TCP stream runs outside Go's network poller. Go registers
// every socket with its epoll set, edge-triggered, and while any goroutine
// of the process waits on the network (the transport's accept loop, the
// rendezvous store's connection) an idle thread sleeps in epoll_pwait: it
// is woken each time data lands on any registered socket, finds no
// goroutine waiting for it (the one-goroutine passes read without
// parking), and sleeps again. Counted with perf stat on both ranks of a
// 2-host all-gather of 4 KiB: 1.45 epoll_pwait and 1.6 thread switches
// per call against 0.33 poll(2) of the pass itself, on two cores that the
// ranks and the kernel's TCP processing also need. So once the handshake
// is done, a single-stream link keeps a descriptor of its own for the
// socket (a close-on-exec duplicate) and closes the net.TCPConn, which
// takes the socket out of Go's epoll set; Send, Recv and the passes then
// use it with non-blocking system calls, waiting in poll(2) (at most
// tcpPollWait at a time, to notice cancellation, the operation's
// deadline and Close). Striped links keep their net.TCPConns.

// detach moves the link's one stream onto a descriptor of its own.
func (c *tcpConn) detach() error {
	rc, err := c.ncs[0].SyscallConn()
	if err != nil {
		return err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	// The duplicate shares the socket's status flags: it is non-blocking,
	// as Go made it. Closing the original drops it from Go's epoll set;
	// the socket lives on in fd.
	c.ncs[0].Close()
	c.sock = fd
	return nil
}

// closeFD shuts the socket down, which wakes every call waiting on it,
// then closes the descriptor once none uses it (its number could be
// reused under a call still running).
func (c *tcpConn) closeFD() error {
	unix.Shutdown(c.sock, unix.SHUT_RDWR)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	return unix.Close(c.sock)
}

// fdWait waits until the socket may be ready for events, or tcpPollWait
// passes; it fails once ctx is done or the link is closed.
func (c *tcpConn) fdWait(ctx context.Context, events int16) error {
	if c.closed.Load() {
		return ErrLinkClosed
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	wait := tcpPollWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, max(time.Until(dl), 0))
	}
	fds := []unix.PollFd{{Fd: int32(c.sock), Events: events}}
	if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && err != syscall.EINTR {
		return os.NewSyscallError("poll", err)
	}
	return nil
}

// writeFD writes all of bufs, waiting as it must; it returns how many
// bytes went out.
func (c *tcpConn) writeFD(ctx context.Context, bufs [][]byte) (int, error) {
	n := 0
	for len(bufs) > 0 {
		m, err := writev(c.sock, tcpLimit(bufs, tcpWriteMax, nil))
		switch {
		case m > 0:
			n += m
			bufs = tcpConsume(bufs, m)
		case err == syscall.EAGAIN || err == syscall.EINTR:
			if err := c.fdWait(ctx, unix.POLLOUT); err != nil {
				return n, err
			}
		default:
			return n, os.NewSyscallError("writev", err)
		}
	}
	return n, nil
}

// readFD fills b, waiting as it must; it returns how many bytes came in.
func (c *tcpConn) readFD(ctx context.Context, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Read(c.sock, b[n:])
		switch {
		case m > 0:
			n += m
		case err == syscall.EAGAIN || err == syscall.EINTR:
			if err := c.fdWait(ctx, unix.POLLIN); err != nil {
				return n, err
			}
		case err != nil:
			return n, os.NewSyscallError("read", err)
		default:
			return n, io.EOF
		}
	}
	return n, nil
}

// sendFD is Send on a detached stream: the length and b in one writev.
func (c *tcpConn) sendFD(ctx context.Context, b []byte) error {
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(b)))
	linkRaceRelease() // before the bytes can reach the peer (see link_race.go)
	n, err := c.writeFD(ctx, [][]byte{l[:], b})
	if err != nil {
		if n > 0 {
			c.sendErr = ErrLinkBroken
		}
		return c.fail(ctx, "send", err)
	}
	return nil
}

// recvFD is Recv on a detached stream. A message of another length is
// read and dropped, so that the link stays usable, and reported.
func (c *tcpConn) recvFD(ctx context.Context, b []byte) error {
	var l [8]byte
	n, err := c.readFD(ctx, l[:])
	if err == nil {
		linkRaceAcquire() // the sender released before its first byte: see link_race.go
		err = c.recvBody(ctx, binary.LittleEndian.Uint64(l[:]), b)
	}
	if err != nil {
		if n > 0 && !errors.Is(err, ErrMessageLength) {
			c.recvErr = ErrLinkBroken
		}
		return c.fail(ctx, "recv", err)
	}
	return nil
}

// recvBody reads an n-byte message into b, or drops it when n is not
// len(b).
func (c *tcpConn) recvBody(ctx context.Context, n uint64, b []byte) error {
	if n > math.MaxInt/2 {
		return fmt.Errorf("message header says %d bytes: stream out of step", n)
	}
	if n == uint64(len(b)) {
		_, err := c.readFD(ctx, b)
		return err
	}
	drop := make([]byte, min(int(n), tcpReadBuf))
	for left := int(n); left > 0; left -= len(drop) {
		drop = drop[:min(left, len(drop))]
		if _, err := c.readFD(ctx, drop); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: got a message of %d bytes, want %d (the ranks disagree about the call)", ErrMessageLength, n, len(b))
}

// writev writes bufs with one writev(2): unix.Writev without its race
// annotations. unix.Writev tells the race detector that the buffers were
// read when the call returns; by then the peer, a goroutine of the same
// test process, may have the bytes and be writing that memory with the
// next message, which the detector reported as a race (the two-goroutine
// ring between a shared-memory and a TCP neighbour, TestDirectOverSHM).
// The kernel's read of the buffers happens before any byte leaves, and
// the ordering a link gives is annotated by linkRaceRelease and
// linkRaceAcquire (link_race.go). The iovecs of a short list stay on the
// stack.
func writev(fd int, bufs [][]byte) (int, error) {
	var arr [16]unix.Iovec
	iov := arr[:0]
	for _, b := range bufs {
		if len(b) > 0 {
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	if len(iov) == 0 {
		return 0, nil
	}
	n, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
