package comm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var tpSecret = []byte("0123456789abcdef0123456789abcdef")

// tpTCP returns a maker of loopback TCP transports sharing one store.
func tpTCP(store Store, conns int, secret func(rank int) []byte) func(rank int) (Transport, error) {
	return func(rank int) (Transport, error) {
		return NewTCP(context.Background(), TCPConfig{
			Rank: rank, Size: 2, Store: store, Secret: secret(rank), Prefix: "job/0/tcp",
			Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ConnsPerPeer: conns, DialTimeout: 5 * time.Second,
		})
	}
}

func tpSameSecret(int) []byte { return tpSecret }

func TestTCPRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 4095, 4<<20 + 7}
	for _, conns := range []int{1, 3} {
		t.Run(map[int]string{1: "one-conn", 3: "three-conns"}[conns], func(t *testing.T) {
			store := NewMemStore()
			const n = 4
			_, links := tpMesh(t, n, func(rank int) (Transport, error) {
				return NewTCP(t.Context(), TCPConfig{Rank: rank, Size: n, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
					Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ConnsPerPeer: conns})
			})
			tpExchange(t, links, sizes)
		})
	}
}

func TestTCPConnectIsIdempotent(t *testing.T) {
	store := NewMemStore()
	ts, conns := tpMesh(t, 2, tpTCP(store, 1, tpSameSecret))
	again, err := ts[1].Connect(tpCtx(t), 0)
	if err != nil || again != conns[1][0] {
		t.Fatalf("second Connect = %v, %v; want the same link", again, err)
	}
	if _, err := ts[0].Connect(tpCtx(t), 0); err == nil {
		t.Fatal("Connect to self succeeded")
	}
}

func TestTCPWrongSecret(t *testing.T) {
	store := NewMemStore()
	other := []byte("another-secret-another-secret-xx")
	mk := tpTCP(store, 1, func(rank int) []byte { return map[int][]byte{0: tpSecret, 1: other}[rank] })
	t0, err := mk(0)
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	t1, err := mk(1)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	_, err = t0.Connect(tpCtx(t), 1)
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("dialer Connect: %v; want an auth error naming rank 1", err)
	}
	t.Logf("dialer: %v", err)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = t1.Connect(ctx, 0)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last rejected connection") {
		t.Fatalf("acceptor Connect: %v; want a timeout that names the rejected connection", err)
	}
	t.Logf("acceptor: %v", err)
}

// TestTCPRejectsGarbage dials the listener raw: garbage, a forged proof
// and a hello for another rank are all dropped, and a real peer still
// gets through afterwards.
func TestTCPRejectsGarbage(t *testing.T) {
	store := NewMemStore()
	mk := tpTCP(store, 1, tpSameSecret)
	t1, err := mk(1)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	addr, _ := store.Get(tpCtx(t), tcpAddrKey("job/0/tcp", 1))
	hello := func(from, to int) []byte {
		return (&tcpHello{from: from, to: to, stream: 0, streams: 1, nonce: make([]byte, tcpNonceLen)}).marshal()
	}
	cases := []struct {
		name string
		send [][]byte
	}{
		{"garbage", [][]byte{bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4)}},
		{"wrong-rank", [][]byte{hello(0, 2)}},
		{"forged-proof", [][]byte{hello(0, 1), make([]byte, tcpMACLen)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", string(addr))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			for _, b := range tc.send {
				nc.Write(b)
			}
			got, err := io.ReadAll(nc)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read: %v; want the server to hang up", err)
			}
			if len(got) > tcpNonceLen+tcpMACLen+1 {
				t.Fatalf("server sent %d bytes to an unauthenticated client", len(got))
			}
		})
	}
	t0, err := mk(0)
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	var wg sync.WaitGroup
	var c0, c1 Conn
	var e0, e1 error
	wg.Go(func() { c0, e0 = t0.Connect(tpCtx(t), 1) })
	wg.Go(func() { c1, e1 = t1.Connect(tpCtx(t), 0) })
	wg.Wait()
	if e0 != nil || e1 != nil {
		t.Fatalf("real peers after garbage: %v, %v", e0, e1)
	}
	tpExchange(t, [][]Conn{{nil, c0}, {c1, nil}}, []int{5})
}

func TestTCPLengthMismatch(t *testing.T) {
	for _, conns := range []int{1, 2} {
		a, b := tpPair(t, tpTCP(NewMemStore(), conns, tpSameSecret))
		tpCheckMismatch(t, a, b, []int{10, 2 << 20})
	}
}

// tpCheckMismatch sends messages one byte longer than b expects: each Recv
// must fail with ErrMessageLength, and the link must stay in step.
func tpCheckMismatch(t *testing.T, a, b Conn, sizes []int) {
	t.Helper()
	ctx := tpCtx(t)
	for _, n := range sizes {
		go a.Send(ctx, tpPattern(0, 1, n+1))
		err := b.Recv(ctx, make([]byte, n))
		if !errors.Is(err, ErrMessageLength) {
			t.Fatalf("recv %d bytes of a %d-byte message: %v; want ErrMessageLength", n, n+1, err)
		}
		t.Logf("mismatch: %v", err)
		go a.Send(ctx, tpPattern(0, 1, n))
		if err := tpRecvAll(ctx, b, 0, 1, []int{n}); err != nil {
			t.Fatalf("after a mismatch: %v", err)
		}
	}
}

func TestTCPCancelUnblocksRecv(t *testing.T) {
	a, b := tpPair(t, tpTCP(NewMemStore(), 1, tpSameSecret))
	tpCheckCancel(t, a, b)
}

// tpCheckCancel: a cancelled or expired ctx unblocks a pending Recv, and
// a Recv that had read nothing leaves the link usable.
func tpCheckCancel(t *testing.T, a, b Conn) {
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := tpWithin(t, 2*time.Second, "cancelled recv", func() error { return b.Recv(ctx, make([]byte, 8)) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Recv: %v; want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = tpWithin(t, 2*time.Second, "expired recv", func() error { return b.Recv(ctx, make([]byte, 8)) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired Recv: %v; want context.DeadlineExceeded", err)
	}
	go a.Send(tpCtx(t), tpPattern(0, 1, 8))
	if err := tpRecvAll(tpCtx(t), b, 0, 1, []int{8}); err != nil {
		t.Fatalf("after a cancelled Recv: %v", err)
	}
}

func TestTCPPeerClose(t *testing.T) {
	tpCheckClose(t, func() Store { return NewMemStore() }, func(store Store) func(int) (Transport, error) {
		return tpTCP(store, 2, tpSameSecret)
	})
}

// tpCheckClose: closing one end fails the other end's pending Recv with
// ErrPeerClosed, and closing an end fails its own pending and later calls
// with ErrLinkClosed.
func tpCheckClose(t *testing.T, newStore func() Store, mk func(Store) func(int) (Transport, error)) {
	a, b := tpPair(t, mk(newStore()))
	time.AfterFunc(50*time.Millisecond, func() { a.Close() })
	err := tpWithin(t, 2*time.Second, "recv from closed peer", func() error { return b.Recv(tpCtx(t), make([]byte, 8)) })
	if !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Recv after peer Close: %v; want ErrPeerClosed", err)
	}
	if err := a.Send(tpCtx(t), []byte("x")); !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("Send after Close: %v; want ErrLinkClosed", err)
	}
	a, b = tpPair(t, mk(newStore()))
	time.AfterFunc(50*time.Millisecond, func() { b.Close() })
	err = tpWithin(t, 2*time.Second, "recv on closing end", func() error { return b.Recv(tpCtx(t), make([]byte, 8)) })
	if !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("Recv pending on Close: %v; want ErrLinkClosed", err)
	}
}

func TestTCPCloseEndsConnect(t *testing.T) {
	store := NewMemStore()
	tr, err := tpTCP(store, 1, tpSameSecret)(1)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, func() { tr.Close() })
	// Rank 0 never comes, so rank 1 waits to be dialed until Close.
	err = tpWithin(t, 2*time.Second, "connect on a closing transport", func() error {
		_, err := tr.Connect(tpCtx(t), 0)
		return err
	})
	if !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("Connect on a closing transport: %v; want ErrLinkClosed", err)
	}
}

func TestTCPGroups(t *testing.T) {
	store := NewMemStore()
	ts := make([]Transport, 3)
	for r := range ts {
		tr, err := NewTCP(t.Context(), TCPConfig{Rank: r, Size: 3, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
			Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ConnsPerPeer: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ts[r] = tr
	}
	tpCheckGroups(t, ts)
}

// TestTCPBufSize checks TCPConfig.BufSize: a size sets both socket
// buffers of every link (the kernel reports twice what was set, its
// bookkeeping included); sizes out of range are refused by name. The
// default, the kernel's autotuning, sets nothing: the buffers start at
// net.ipv4.tcp_rmem's and tcp_wmem's defaults and grow.
func TestTCPBufSize(t *testing.T) {
	const size = 96 << 10 // under any net.core.rmem_max a kernel starts with
	for _, buf := range []int{0, size} {
		store := NewMemStore()
		_, links := tpMesh(t, 2, func(rank int) (Transport, error) {
			return NewTCP(t.Context(), TCPConfig{Rank: rank, Size: 2, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
				Bind: "127.0.0.1:0", Advertise: "127.0.0.1", BufSize: buf})
		})
		for r := range 2 {
			fd := links[r][1-r].(*tcpConn).sock
			for _, opt := range []int{unix.SO_SNDBUF, unix.SO_RCVBUF} {
				got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
				switch {
				case err != nil:
					t.Fatal(err)
				case buf > 0 && got != 2*buf:
					t.Errorf("BufSize %d: rank %d's socket option %d is %d, want %d", buf, r, opt, got, 2*buf)
				case buf == 0 && got == 2*size:
					t.Errorf("BufSize 0: rank %d's socket option %d is %d, as if set", r, opt, got)
				}
			}
		}
		tpExchange(t, links, []int{1, 1 << 20})
	}
	for _, bad := range []int{1, MinTCPBufSize - 1, MaxTCPBufSize + 1} {
		_, err := NewTCP(t.Context(), TCPConfig{Rank: 0, Size: 2, Store: NewMemStore(), Secret: tpSecret, Prefix: "job/0/tcp",
			Bind: "127.0.0.1:0", Advertise: "127.0.0.1", BufSize: bad})
		if err == nil || !strings.Contains(err.Error(), "socket buffers of") {
			t.Errorf("BufSize %d: %v, want it refused naming the socket buffers", bad, err)
		}
	}
}
