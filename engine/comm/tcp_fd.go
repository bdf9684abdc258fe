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
//
// The non-blocking calls (writev, readv, read) are raw system calls: the
// Go scheduler is not told of them, as it is not of a function call. Told
// (syscall.Syscall), it counts the thread as in a system call, and one
// that lasts past a tick of the runtime's monitor (20 µs when busy) loses
// its P: the monitor hands it to another thread, waking one to look for
// work, and the caller must take a P back when the call returns. A write
// of a 256 KiB chunk copies it into the socket and, on a veth, runs the
// receiver's TCP processing too: 37-100 µs at the 2.6-7 GB/s such
// transfers ran at here, well past a tick. With a rank bound to one core
// (the bench harness's PIN=1; gtrain's --bind core gives each rank its
// share of its node's cores, one on a 2-core host) the woken threads
// take that core from the caller: in an all-reduce of 1 MiB between two
// network-namespace hosts a rank switched 6.6 times a call in some runs
// (7,250 times in 1,100 calls; 924 µs a call) and 0.3-0.7 in others (155
// µs), and with raw calls 0.2-0.4 in every run (docs/benchmarks.md, "Raw
// system calls"). None of these calls can block: the descriptor is
// non-blocking (detach makes sure), so the most a call holds its P is
// one copy. poll(2), which does block, stays a scheduler-visible call.

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
	// as Go made it, and the raw calls need it to be (set again, not
	// assumed). Closing the original drops it from Go's epoll set; the
	// socket lives on in fd.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
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
		m, err := readv(c.sock, [][]byte{b[n:]})
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
// stack. It is a raw system call, for a non-blocking descriptor only
// (see the top of this file).
func writev(fd int, bufs [][]byte) (int, error) {
	return rawv(unix.SYS_WRITEV, fd, bufs)
}

// readv reads into bufs with one readv(2), raw as writev and for the
// same descriptors. In -race builds it tells the detector which bytes it
// wrote, as unix.Readv does; the link's ordering is annotated as for
// writev.
func readv(fd int, bufs [][]byte) (int, error) {
	n, err := rawv(unix.SYS_READV, fd, bufs)
	linkRaceWrote(bufs, n)
	return n, err
}

// rawv is writev(2) or readv(2) (trap) of the non-empty buffers of bufs,
// as a raw system call. Nothing to move is 0 bytes, not a call.
func rawv(trap uintptr, fd int, bufs [][]byte) (int, error) {
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
	n, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
