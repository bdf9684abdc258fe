package comm

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestTCPLocalJobListensOnLoopback: with TCP forced between ranks of one
// host (GTRAIN_COMM_NO_SHM=1) and no address configured, the listeners
// bind loopback, not every interface.
func TestTCPLocalJobListensOnLoopback(t *testing.T) {
	store := NewMemStore()
	ts, links := tpMesh(t, 2, func(rank int) (Transport, error) {
		return Connect(t.Context(), BootstrapConfig{Rank: rank, Size: 2, Store: store, Secret: tpSecret,
			Prefix: "job/0", NoSHM: true, TCP: TCPConfig{DialTimeout: 5 * time.Second}})
	})
	for r, tr := range ts {
		tcp, ok := tr.(*routedTransport).tcp.(*tcpTransport)
		if !ok {
			t.Fatalf("rank %d has no TCP transport", r)
		}
		if ip := tcp.ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("rank %d listens on %v, want loopback", r, tcp.ln.Addr())
		}
	}
	tpExchange(t, links, []int{10})
}

func TestTCPDefaultBind(t *testing.T) {
	tests := []struct{ advertise, want string }{
		{"127.0.0.1", "127.0.0.1:0"},
		{"::1", "[::1]:0"},
		{"192.0.2.7", ":0"},     // not this host's (TEST-NET-1): maybe NATed to it
		{"node7.example", ":0"}, // a name: bind everything it may resolve to
		{"", ":0"},
	}
	if ip := tcpDefaultAdvertise(); ip != "127.0.0.1" {
		tests = append(tests, struct{ advertise, want string }{ip, net.JoinHostPort(ip, "0")})
	}
	for _, tt := range tests {
		if got := tcpDefaultBind(tt.advertise); got != tt.want {
			t.Errorf("tcpDefaultBind(%q) = %q, want %q", tt.advertise, got, tt.want)
		}
	}
}

// tpLogLines collects a transport's log lines.
type tpLogLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *tpLogLines) log(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }

func (l *tpLogLines) grep(sub string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			out = append(out, s)
		}
	}
	return out
}

// tpIdle opens n connections to addr that never say anything.
func tpIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		out = append(out, nc)
	}
	return out
}

// tpReadEnd reads nc until the server ends it; it fails the test if the
// server keeps it open for the whole (generous) backstop.
func tpReadEnd(t *testing.T, nc net.Conn) error {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.ReadAll(nc)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection from %s still open after 20s: the server did not end it", nc.LocalAddr())
	}
	return err
}

// TestTCPCapsPendingHandshakes: with MaxHandshakes connections idle in
// their handshake, more connections are reset at once and logged, and a
// real rank dialing meanwhile is reset too but retries, and gets through
// once a slot is free.
func TestTCPCapsPendingHandshakes(t *testing.T) {
	const slots, extra = 4, 3
	store := NewMemStore()
	logs := &tpLogLines{}
	t1, err := NewTCP(t.Context(), TCPConfig{Rank: 1, Size: 2, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
		Bind: "127.0.0.1:0", Advertise: "127.0.0.1", DialTimeout: time.Minute, MaxHandshakes: slots, Log: logs.log})
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	addr, _ := store.Get(tpCtx(t), tcpAddrKey("job/0/tcp", 1))
	// The listener accepts in connection order, so these hold every slot.
	idle := tpIdle(t, string(addr), slots)
	for i := range extra {
		nc, err := net.Dial("tcp", string(addr))
		if err == nil { // else the reset came before the dial finished
			err = tpReadEnd(t, nc)
			nc.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("extra connection %d: %v, want reset at once", i, err)
		}
	}
	if got := t1.(*tcpTransport).refused.Load(); got != extra {
		t.Fatalf("refused %d connections, want %d", got, extra)
	}
	if got := logs.grep("refused a connection"); len(got) == 0 {
		t.Error("refusals were not logged")
	}
	t0, err := NewTCP(t.Context(), TCPConfig{Rank: 0, Size: 2, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
		Bind: "127.0.0.1:0", Advertise: "127.0.0.1", DialTimeout: time.Minute, Log: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	dialed := make(chan error, 1)
	go func() {
		_, err := t0.Connect(tpCtx(t), 1)
		dialed <- err
	}()
	backstop := time.After(20 * time.Second)
	for t1.(*tcpTransport).refused.Load() == extra { // the rank's first try is refused
		select {
		case err := <-dialed:
			t.Fatalf("rank 0 connected (%v) while every handshake slot was taken", err)
		case <-backstop:
			t.Fatal("rank 0 was not refused within 20s while every handshake slot was taken")
		case <-time.After(time.Millisecond):
		}
	}
	for _, nc := range idle {
		nc.Close() // frees the slots
	}
	if err := <-dialed; err != nil {
		t.Fatalf("rank 0 Connect after the slots freed: %v", err)
	}
	if _, err := t1.Connect(tpCtx(t), 0); err != nil {
		t.Fatalf("rank 1 Connect: %v", err)
	}
}

// TestTCPDropsIdleHandshakes: a connection that does not authenticate
// within the handshake deadline is closed and logged.
func TestTCPDropsIdleHandshakes(t *testing.T) {
	const deadline = 200 * time.Millisecond
	store := NewMemStore()
	logs := &tpLogLines{}
	t1, err := NewTCP(t.Context(), TCPConfig{Rank: 1, Size: 2, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
		Bind: "127.0.0.1:0", Advertise: "127.0.0.1", DialTimeout: deadline, MaxHandshakes: 2, Log: logs.log})
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	addr, _ := store.Get(tpCtx(t), tcpAddrKey("job/0/tcp", 1))
	start := time.Now()
	for i, nc := range tpIdle(t, string(addr), 2) {
		if err := tpReadEnd(t, nc); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("idle connection %d: %v, want closed", i, err)
		}
	}
	if d := time.Since(start); d < deadline {
		t.Errorf("idle connections closed after %v, before the %v deadline", d, deadline)
	}
	if got := logs.grep("dropped a connection"); len(got) == 0 || !strings.Contains(got[0], "timeout") {
		t.Errorf("log = %q, want the dropped idle connection with its timeout", got)
	}
	if got := t1.(*tcpTransport).refused.Load(); got != 0 {
		t.Errorf("%d connections refused; the idle ones had slots", got)
	}
}
