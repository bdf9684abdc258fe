package comm

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The connection handshake (all integers big-endian):
//
//	dialer → acceptor  hello:     "gtc1" from:u32 to:u32 stream:u16 streams:u16
//	                              len(group):u16 group nonceD:[32]
//	acceptor → dialer  challenge: nonceA:[32] macA:[32]
//	dialer → acceptor  auth:      macD:[32]
//	acceptor → dialer  welcome:   status:u8 (0 ok, 1 wrong proof)
//
// mac = HMAC-SHA256(secret, "gtrain comm v1" 0x00 role len(prefix):u32
// prefix hello nonceA), role 'A' for the acceptor's proof and 'D' for the
// dialer's. Each side proves knowledge of the secret over both nonces, both
// rank ids, the group, the stream and the job prefix, so a proof can be
// neither replayed, reflected, nor used to redirect a connection to another
// rank, group, stream or job. The dialer checks the acceptor's proof before giving its
// own. An acceptor with too many connections authenticating resets a new
// one at once (no hello read), which the dialer retries; an acceptor that
// does not expect the hello closes the connection in order, which fails it. After the welcome, each message is a u64 little-endian length and
// the bytes; a message of tcpStripeMin bytes or more is split into
// ConnsPerPeer equal parts, part i on stream i, the length on stream 0.
const (
	tcpLabel      = "gtrain comm v1"
	tcpNonceLen   = 32
	tcpMACLen     = sha256.Size
	tcpHelloFixed = 4 + 4 + 4 + 2 + 2 + 2 // up to and with len(group)
	tcpWelcome    = 0
	tcpBadProof   = 1
)

var tcpMagic = []byte("gtc1")

type tcpHello struct {
	from, to, stream, streams int
	group                     string
	nonce                     []byte
}

func (h *tcpHello) marshal() []byte {
	b := append(make([]byte, 0, tcpHelloFixed+len(h.group)+tcpNonceLen), tcpMagic...)
	b = binary.BigEndian.AppendUint32(b, uint32(h.from))
	b = binary.BigEndian.AppendUint32(b, uint32(h.to))
	b = binary.BigEndian.AppendUint16(b, uint16(h.stream))
	b = binary.BigEndian.AppendUint16(b, uint16(h.streams))
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.group)))
	b = append(b, h.group...)
	return append(b, h.nonce...)
}

// readTCPHello reads a hello: the fixed part, then the group and nonce.
func readTCPHello(r io.Reader) (*tcpHello, error) {
	b := make([]byte, tcpHelloFixed)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if string(b[:4]) != string(tcpMagic) {
		return nil, fmt.Errorf("not a gtrain comm v1 hello: %w", ErrAuth)
	}
	n := int(binary.BigEndian.Uint16(b[16:]))
	if n > MaxGroupName {
		return nil, fmt.Errorf("hello with a group name of %d bytes: %w", n, ErrAuth)
	}
	rest := make([]byte, n+tcpNonceLen)
	if _, err := io.ReadFull(r, rest); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	return &tcpHello{
		from:    int(binary.BigEndian.Uint32(b[4:])),
		to:      int(binary.BigEndian.Uint32(b[8:])),
		stream:  int(binary.BigEndian.Uint16(b[12:])),
		streams: int(binary.BigEndian.Uint16(b[14:])),
		group:   string(rest[:n]),
		nonce:   rest[n:],
	}, nil
}

func tcpMAC(secret []byte, role byte, prefix string, h *tcpHello, nonceA []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tcpLabel))
	m.Write([]byte{0, role})
	m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(prefix))))
	m.Write([]byte(prefix))
	m.Write(h.marshal())
	m.Write(nonceA)
	return m.Sum(nil)
}

func tcpNonce() []byte {
	b := make([]byte, tcpNonceLen)
	rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return b
}

// serverHandshake authenticates an incoming connection within DialTimeout.
func (t *tcpTransport) serverHandshake(nc *net.TCPConn) (*tcpHello, error) {
	nc.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	h, err := readTCPHello(nc)
	if err != nil {
		return nil, err
	}
	if h.to != t.cfg.Rank || h.from < 0 || h.from >= h.to || h.streams != t.cfg.ConnsPerPeer || h.stream >= h.streams {
		return nil, fmt.Errorf("hello from rank %d to rank %d, stream %d of %d: not expected by rank %d with %d connections per peer: %w",
			h.from, h.to, h.stream, h.streams, t.cfg.Rank, t.cfg.ConnsPerPeer, ErrAuth)
	}
	na := tcpNonce()
	if _, err := nc.Write(append(na, tcpMAC(t.cfg.Secret, 'A', t.cfg.Prefix, h, na)...)); err != nil {
		return nil, fmt.Errorf("send challenge: %w", err)
	}
	mac := make([]byte, tcpMACLen)
	if _, err := io.ReadFull(nc, mac); err != nil {
		return nil, fmt.Errorf("read proof of rank %d (a dialer with another secret hangs up here): %w", h.from, err)
	}
	if !hmac.Equal(mac, tcpMAC(t.cfg.Secret, 'D', t.cfg.Prefix, h, na)) {
		nc.Write([]byte{tcpBadProof})
		return nil, fmt.Errorf("rank %d gave a wrong proof: it does not know this job's secret: %w", h.from, ErrAuth)
	}
	if _, err := nc.Write([]byte{tcpWelcome}); err != nil {
		return nil, fmt.Errorf("send welcome: %w", err)
	}
	return h, nc.SetDeadline(time.Time{})
}

// clientHandshake authenticates a dialed connection; it checks the
// acceptor's proof before giving its own.
func (t *tcpTransport) clientHandshake(ctx context.Context, nc *net.TCPConn, h *tcpHello) error {
	stop := tcpWatch(ctx, []*net.TCPConn{nc}, (*net.TCPConn).SetDeadline)
	defer stop()
	h.nonce = tcpNonce()
	if _, err := nc.Write(h.marshal()); err != nil {
		if tcpReset(err) {
			return fmt.Errorf("send hello: %w", errTCPBusy)
		}
		return fmt.Errorf("send hello: %w", err)
	}
	ch := make([]byte, tcpNonceLen+tcpMACLen)
	if n, err := io.ReadFull(nc, ch); err != nil {
		if n == 0 && tcpReset(err) {
			return fmt.Errorf("read challenge: %w", errTCPBusy)
		}
		return tcpHandshakeErr(ctx, "challenge", err)
	}
	na, mac := ch[:tcpNonceLen], ch[tcpNonceLen:]
	if !hmac.Equal(mac, tcpMAC(t.cfg.Secret, 'A', t.cfg.Prefix, h, na)) {
		return fmt.Errorf("rank %d gave a wrong proof: it does not know this job's secret: %w", h.to, ErrAuth)
	}
	if _, err := nc.Write(tcpMAC(t.cfg.Secret, 'D', t.cfg.Prefix, h, na)); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	st := []byte{0}
	if _, err := io.ReadFull(nc, st); err != nil {
		return tcpHandshakeErr(ctx, "welcome", err)
	}
	if st[0] != tcpWelcome {
		return fmt.Errorf("rank %d refused our proof: %w", h.to, ErrAuth)
	}
	return nc.SetDeadline(time.Time{})
}

// errTCPBusy is an acceptor's reset before its challenge: it had too many
// connections authenticating (see tcpTransport.refuse). Dialers retry it.
var errTCPBusy = errors.New("reset before the challenge: the peer has too many connections authenticating")

// tcpReset reports whether err is the peer resetting the connection.
func tcpReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func tcpHandshakeErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("read %s: %w", what, context.Cause(ctx))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("peer hung up before %s (is it another job or attempt?): %w", what, ErrAuth)
	}
	return fmt.Errorf("read %s: %w", what, err)
}

// tcpPast is a deadline in the past: setting it unblocks pending I/O.
var tcpPast = time.Unix(1, 0)

// tcpWatch applies ctx to the connections through set (a deadline setter):
// ctx's deadline now, and an immediate deadline when ctx is cancelled. stop
// returns once the cancellation hook can no longer run.
func tcpWatch(ctx context.Context, ncs []*net.TCPConn, set func(*net.TCPConn, time.Time) error) (stop func()) {
	dl, _ := ctx.Deadline()
	for _, nc := range ncs {
		set(nc, dl)
	}
	if ctx.Done() == nil {
		return func() {}
	}
	fired := make(chan struct{})
	stopHook := context.AfterFunc(ctx, func() {
		for _, nc := range ncs {
			set(nc, tcpPast)
		}
		close(fired)
	})
	return func() {
		if !stopHook() {
			<-fired
		}
	}
}

// tcpConn is one link: one or more authenticated streams to a peer. A
// link of one stream runs on its socket's own descriptor, sock, outside
// Go's network poller (tcp_fd.go); a striped one on its net.TCPConns.
type tcpConn struct {
	peer    int
	addr    string
	ncs     []*net.TCPConn
	rds     []*bufio.Reader
	sock    int // the descriptor of a detached stream, or -1
	sendHdr [8]byte
	recvHdr [8]byte
	sendErr error // sticky; under sendMu
	recvErr error // sticky; under recvMu
	closed  atomic.Bool
	once    sync.Once
	wait    tcpWaitConfig // how a pass over TCP waits on this link
	spinBo  tcpBackoff    // and how its waits went; under recvMu
	// sendMu and recvMu order successive calls from different goroutines
	// (the Conn contract allows one of each at a time, not a fixed one).
	sendMu, recvMu sync.Mutex
}

func newTCPConn(peer int, ncs []*net.TCPConn) *tcpConn {
	c := &tcpConn{peer: peer, addr: ncs[0].RemoteAddr().String(), ncs: ncs, sock: -1}
	if len(ncs) == 1 && c.detach() == nil {
		return c
	}
	for _, nc := range ncs {
		c.rds = append(c.rds, bufio.NewReaderSize(nc, tcpReadBuf))
	}
	return c
}

// Send writes the length and then b, striped when long.
func (c *tcpConn) Send(ctx context.Context, b []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.precheck(ctx, c.sendErr); err != nil {
		return c.fail(ctx, "send", err)
	}
	if c.sock >= 0 {
		return c.sendFD(ctx, b)
	}
	stop := tcpWatch(ctx, c.ncs, (*net.TCPConn).SetWriteDeadline)
	linkRaceRelease() // before the bytes can reach the peer (see link_race.go)
	started, err := c.write(b)
	stop()
	if err != nil {
		if started {
			c.sendErr = ErrLinkBroken
		}
		return c.fail(ctx, "send", err)
	}
	return nil
}

// Recv reads the next message into b; its length must be len(b).
func (c *tcpConn) Recv(ctx context.Context, b []byte) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if err := c.precheck(ctx, c.recvErr); err != nil {
		return c.fail(ctx, "recv", err)
	}
	if c.sock >= 0 {
		return c.recvFD(ctx, b)
	}
	stop := tcpWatch(ctx, c.ncs, (*net.TCPConn).SetReadDeadline)
	started, err := c.read(b)
	stop()
	if err != nil {
		if started && !errors.Is(err, ErrMessageLength) {
			c.recvErr = ErrLinkBroken
		}
		return c.fail(ctx, "recv", err)
	}
	return nil
}

func (c *tcpConn) precheck(ctx context.Context, sticky error) error {
	switch {
	case c.closed.Load():
		return ErrLinkClosed
	case sticky != nil:
		return sticky
	}
	return context.Cause(ctx)
}

// write reports whether any byte went out, since a partial message leaves
// the stream out of step.
func (c *tcpConn) write(b []byte) (started bool, err error) {
	binary.LittleEndian.PutUint64(c.sendHdr[:], uint64(len(b)))
	parts := c.parts(len(b))
	if parts == 1 {
		bufs := net.Buffers{c.sendHdr[:], b}
		n, err := bufs.WriteTo(c.ncs[0])
		return n > 0, err
	}
	errs := make(chan error, parts)
	for i := 1; i < parts; i++ {
		go func() {
			_, err := c.ncs[i].Write(tcpPart(b, i, parts))
			errs <- err
		}()
	}
	bufs := net.Buffers{c.sendHdr[:], tcpPart(b, 0, parts)}
	_, err = bufs.WriteTo(c.ncs[0])
	for i := 1; i < parts; i++ {
		err = errors.Join(err, <-errs)
	}
	return true, err
}

// read reads one message; on a length mismatch it consumes the message so
// that the link stays usable, and reports ErrMessageLength.
func (c *tcpConn) read(b []byte) (started bool, err error) {
	if n, err := io.ReadFull(c.rds[0], c.recvHdr[:]); err != nil {
		return n > 0, err
	}
	linkRaceAcquire() // the sender released before its first byte: see link_race.go
	n := binary.LittleEndian.Uint64(c.recvHdr[:])
	if n > math.MaxInt/2 {
		return true, fmt.Errorf("message header says %d bytes: stream out of step", n)
	}
	dst := b
	if int(n) != len(b) {
		dst = nil // discard it
	}
	parts := c.parts(int(n))
	if parts == 1 {
		err = tcpReadPart(c.rds[0], dst, int(n), 0, 1)
		return true, tcpLengthCheck(err, n, len(b))
	}
	errs := make(chan error, parts)
	for i := 1; i < parts; i++ {
		go func() { errs <- tcpReadPart(c.rds[i], dst, int(n), i, parts) }()
	}
	err = tcpReadPart(c.rds[0], dst, int(n), 0, parts)
	for i := 1; i < parts; i++ {
		err = errors.Join(err, <-errs)
	}
	return true, tcpLengthCheck(err, n, len(b))
}

func tcpLengthCheck(err error, got uint64, want int) error {
	if err == nil && got != uint64(want) {
		return fmt.Errorf("%w: got a message of %d bytes, want %d (the ranks disagree about the call)", ErrMessageLength, got, want)
	}
	return err
}

// tcpReadPart reads part i of an n-byte message into dst, or discards it
// when dst is nil (n > 0).
func tcpReadPart(r *bufio.Reader, dst []byte, n, i, parts int) error {
	lo, hi := i*(n/parts), (i+1)*(n/parts)
	if i == parts-1 {
		hi = n
	}
	if dst == nil {
		_, err := io.CopyN(io.Discard, r, int64(hi-lo))
		return err
	}
	_, err := io.ReadFull(r, dst[lo:hi])
	return err
}

func tcpPart(b []byte, i, parts int) []byte {
	n := len(b)
	lo, hi := i*(n/parts), (i+1)*(n/parts)
	if i == parts-1 {
		hi = n
	}
	return b[lo:hi]
}

func (c *tcpConn) parts(n int) int {
	if n < tcpStripeMin {
		return 1
	}
	return len(c.ncs)
}

// fail wraps err in a *LinkError, naming the cause a caller can act on.
func (c *tcpConn) fail(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, ErrMessageLength), errors.Is(err, ErrLinkBroken), errors.Is(err, ErrLinkClosed):
	case c.closed.Load():
		err = ErrLinkClosed
	case ctx.Err() != nil:
		err = context.Cause(ctx)
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = context.DeadlineExceeded // ctx's deadline, a moment before ctx noticed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		err = fmt.Errorf("%w: %v", ErrPeerClosed, err)
	}
	return &LinkError{Transport: "tcp", Op: op, Peer: c.peer, Addr: c.addr, Err: err}
}

// Close closes every stream; pending calls fail with ErrLinkClosed.
func (c *tcpConn) Close() error {
	var err error
	c.once.Do(func() {
		c.closed.Store(true)
		if c.sock >= 0 {
			err = c.closeFD()
			return
		}
		for _, nc := range c.ncs {
			err = errors.Join(err, nc.Close())
		}
	})
	return err
}
