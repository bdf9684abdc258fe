package comm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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
