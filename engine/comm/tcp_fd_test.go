package comm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketInode returns the inode of the link's socket: what /proc/self/fd
// shows as socket:[inode] for every descriptor of it.
func socketInode(t *testing.T, c *tcpConn) uint64 {
	t.Helper()
	fd := c.sock
	if fd < 0 { // not detached: the net.TCPConn's own descriptor
		rc, err := c.ncs[0].SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		rc.Control(func(s uintptr) { fd, _ = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
		defer unix.Close(fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// epollWatched returns the sockets (by inode) that some epoll set of this
// process watches, from /proc/self/fdinfo; it fails the test if it finds
// no epoll set at all (Go's network poller has one).
func epollWatched(t *testing.T) map[uint64]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	watched, sets := map[uint64]bool{}, 0
	for _, e := range fds {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); l != "anon_inode:[eventpoll]" {
			continue
		}
		sets++
		f, err := os.Open(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var tfd int
			if _, err := fmt.Sscanf(sc.Text(), "tfd: %d", &tfd); err != nil {
				continue
			}
			l, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", tfd))
			var ino uint64
			if _, err := fmt.Sscanf(l, "socket:[%d]", &ino); err == nil {
				watched[ino] = true
			}
		}
		f.Close()
	}
	if sets == 0 {
		t.Fatal("no epoll set in this process: cannot tell what Go's poller watches")
	}
	return watched
}

// TestTCPLinkOutsideNetpoller: a single-stream link's socket is in no
// epoll set of the process (so no thread of Go's poller wakes for its
// data), while the transport still accepts through Go's poller, and the
// link works both ways.
func TestTCPLinkOutsideNetpoller(t *testing.T) {
	comms := tcpWorld(t, 2, 1, Options{})
	requireTCPLinks(t, comms)
	watched := epollWatched(t)
	if len(watched) == 0 {
		t.Fatal("Go's poller watches no socket: the check below would prove nothing")
	}
	for r, c := range comms {
		link := c.conns[1-r].(*tcpConn)
		if ino := socketInode(t, link); watched[ino] {
			t.Errorf("rank %d: the link to rank %d (socket %d) is in an epoll set", r, 1-r, ino)
		}
	}
	testAllReduce(t, comms, caseArgs{dt: Float32, n: 1000, op: Sum, salt: 1})
}

// TestTCPCloseUnblocksRecv: Close of a detached link ends a Recv waiting
// on it at once with ErrLinkClosed, and later calls fail the same way.
func TestTCPCloseUnblocksRecv(t *testing.T) {
	a, _ := tpPair(t, tpTCP(NewMemStore(), 1, tpSameSecret))
	if a.(*tcpConn).sock < 0 {
		t.Fatal("the link is not detached")
	}
	done := make(chan error, 1)
	go func() { done <- a.Recv(context.Background(), make([]byte, 8)) }()
	c := a.(*tcpConn)
	deadline := time.Now().Add(20 * time.Second)
	for c.recvMu.TryLock() { // Recv has not taken the link yet
		c.recvMu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("Recv never started")
		}
		time.Sleep(time.Millisecond)
	}
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLinkClosed) {
			t.Errorf("Recv: %v, want ErrLinkClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Recv still blocked 20 s after Close")
	}
	if err := a.Send(context.Background(), []byte("x")); !errors.Is(err, ErrLinkClosed) || !strings.Contains(err.Error(), "send") {
		t.Errorf("Send after Close: %v, want ErrLinkClosed", err)
	}
}

// TestTCPDetachNonBlocking: the raw calls on a detached stream must never
// block (tcp_fd.go), so detach makes the descriptor non-blocking even
// when the socket it came from was not.
func TestTCPDetachNonBlocking(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	rc, err := d.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(s uintptr) { err = unix.SetNonblock(int(s), false) })
	if err != nil {
		t.Fatal(err)
	}
	c := newTCPConn(1, []*net.TCPConn{d.(*net.TCPConn)}) // detaches a single stream
	if c.sock < 0 {
		t.Fatal("the link is not detached")
	}
	defer c.closeFD()
	fl, err := unix.FcntlInt(uintptr(c.sock), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fl&unix.O_NONBLOCK == 0 {
		t.Fatal("the detached descriptor is blocking: a raw read on it would hold its thread and P")
	}
	// Nothing sent yet: a read returns at once.
	if n, err := readv(c.sock, [][]byte{make([]byte, 8)}); n != 0 || err != unix.EAGAIN {
		t.Fatalf("read on an empty socket: %d, %v; want 0, EAGAIN", n, err)
	}
}

// TestRawv: writev and readv move the non-empty buffers in order, split
// as the reader's buffers are, and report EAGAIN and end of stream as the
// system calls do.
func TestRawv(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	if n, err := writev(fds[0], nil); n != 0 || err != nil {
		t.Fatalf("writev of nothing: %d, %v", n, err)
	}
	if n, err := writev(fds[0], [][]byte{{}, {}}); n != 0 || err != nil {
		t.Fatalf("writev of empty buffers: %d, %v", n, err)
	}
	if n, err := readv(fds[1], [][]byte{make([]byte, 4)}); n != 0 || err != unix.EAGAIN {
		t.Fatalf("readv with nothing sent: %d, %v; want 0, EAGAIN", n, err)
	}
	if n, err := writev(fds[0], [][]byte{[]byte("abc"), {}, []byte("defgh"), []byte("ij")}); n != 10 || err != nil {
		t.Fatalf("writev: %d, %v; want 10, nil", n, err)
	}
	a, b := make([]byte, 4), make([]byte, 4)
	if n, err := readv(fds[1], [][]byte{a, {}, b}); n != 8 || err != nil {
		t.Fatalf("readv: %d, %v; want 8, nil", n, err)
	}
	if got := string(a) + string(b); got != "abcdefgh" {
		t.Fatalf("readv read %q, want %q", got, "abcdefgh")
	}
	c := make([]byte, 8)
	if n, err := readv(fds[1], [][]byte{c}); n != 2 || err != nil || string(c[:2]) != "ij" {
		t.Fatalf("readv of the rest: %d, %v, %q; want 2, nil, \"ij\"", n, err, c[:n])
	}
	unix.Close(fds[1])
	if n, err := readv(fds[1], [][]byte{c}); err != unix.EBADF {
		t.Fatalf("readv on a closed descriptor: %d, %v; want EBADF", n, err)
	}
	if _, err := writev(fds[0], [][]byte{[]byte("x")}); err != unix.EPIPE {
		t.Fatalf("writev to a closed peer: %v; want EPIPE", err)
	}
}
