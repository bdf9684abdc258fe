package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuf collects a server's log lines.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) log(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// env is a running server and what tests need to reach it.
type env struct {
	srv    *Server
	secret []byte
	log    *logBuf
	dialFn func(ctx context.Context) (net.Conn, error)
	addr   string
}

// startTCP runs a server on 127.0.0.1 with a port picked for it.
func startTCP(t *testing.T, nodes ...string) *env {
	t.Helper()
	e := &env{secret: mustSecret(t), log: &logBuf{}}
	srv, err := Listen(Config{Addr: "127.0.0.1:0", Secret: e.secret, Nodes: nodes, Log: e.log.log})
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.addr = srv, srv.Addr().String()
	e.dialFn = func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", e.addr)
	}
	e.serve(t)
	return e
}

// startPipe runs a server on an in-memory listener, for synctest bubbles,
// where real sockets would keep time from advancing.
func startPipe(t *testing.T, nodes ...string) *env {
	t.Helper()
	e := &env{secret: mustSecret(t), log: &logBuf{}, addr: "pipe"}
	ln := newPipeListener()
	e.srv = newServer(Config{Secret: e.secret, Nodes: nodes, Log: e.log.log}, ln)
	e.dialFn = ln.dial
	e.serve(t)
	return e
}

func (e *env) serve(t *testing.T) {
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		e.srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// client dials and authenticates with the job's secret.
func (e *env) client(t *testing.T) *Client {
	t.Helper()
	c, err := e.dialWith(context.Background(), e.secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) dialWith(ctx context.Context, secret []byte) (*Client, error) {
	nc, err := e.dialFn(ctx)
	if err != nil {
		return nil, err
	}
	return newClient(ctx, nc, e.addr, secret)
}

// raw opens an unauthenticated connection for hand-written lines.
func (e *env) raw(t *testing.T) *rawConn {
	t.Helper()
	nc, err := e.dialFn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// rawConn speaks the protocol by hand.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func (r *rawConn) writeLine(s string) {
	r.t.Helper()
	if _, err := fmt.Fprintf(r.nc, "%s\n", s); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) write(m *message) {
	r.t.Helper()
	if err := writeMessage(r.nc, m); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// read returns the next message, or nil at end of stream.
func (r *rawConn) read() *message {
	r.t.Helper()
	line, err := readLine(r.br, maxReplyLine)
	if err != nil {
		return nil
	}
	m, err := decodeMessage(line)
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	return m
}

// handshake authenticates with secret, playing the client by hand.
func (r *rawConn) handshake(secret []byte) {
	r.t.Helper()
	cn := newNonce()
	r.write(&message{Type: typeHello, Nonce: cn})
	ch := r.read()
	if ch == nil || ch.Type != typeChallenge {
		r.t.Fatalf("want challenge, got %+v", ch)
	}
	r.write(&message{Type: typeAuth, MAC: proof(secret, clientLabel, cn, ch.Nonce)})
	if w := r.read(); w == nil || w.Type != typeWelcome {
		r.t.Fatalf("want welcome, got %+v", w)
	}
}

func mustSecret(t *testing.T) []byte {
	t.Helper()
	s, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pipeListener is an in-memory net.Listener of net.Pipe connections. The
// server's end reports a distinct 10.0.0.x address per connection, so tests
// can check observed addresses.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	next  int
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 29400} }

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	l.mu.Lock()
	l.next++
	remote := &net.TCPAddr{IP: net.IPv4(10, 0, 0, byte(1+l.next)), Port: 40000 + l.next}
	l.mu.Unlock()
	srv, cli := net.Pipe()
	select {
	case l.conns <- addrConn{srv, remote}:
		return cli, nil
	case <-l.done:
		return nil, errors.New("listener closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
