package comm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// TCP defaults and limits.
const (
	DefaultTCPCongestion  = "reno"           // TCP_CONGESTION of the links (see tcp_cc.go)
	TCPCongestionSystem   = "system"         // TCPConfig.Congestion: keep the system's
	DefaultTCPDialTimeout = 20 * time.Second // per connection, dial and handshake
	DefaultTCPHandshakes  = 64               // incoming connections authenticating at once
	MaxTCPConnsPerPeer    = 16               // most connections per peer
	MinTCPBufSize         = 4 << 10          // least TCPConfig.BufSize, when set
	MaxTCPBufSize         = 1 << 30          // most TCPConfig.BufSize (the kernel caps it lower)
	MaxGroupName          = 1024             // longest group name of ConnectGroup
	tcpStripeMin          = 256 << 10        // messages this long or longer are striped
	tcpMinSecret          = 16
	tcpReadBuf            = 64 << 10
)

// TCPConfig configures NewTCP.
type TCPConfig struct {
	Rank, Size int
	Store      Store
	Secret     []byte // the job's secret, at least 16 bytes
	Prefix     string // store key namespace for this job and attempt
	// Bind is the listen address. The default is the Advertise address
	// with a free port when that is an address of this host (loopback when
	// every peer is on this host), else ":0": a listener reachable only
	// where the peers dial.
	Bind string
	// Advertise is the host peers dial, published with the port; default
	// the first non-loopback IPv4 address of this host, else 127.0.0.1.
	Advertise string
	// ConnsPerPeer is the number of connections per link (default 1);
	// messages of 256 KiB and more are striped across them.
	ConnsPerPeer int
	// BufSize, when positive, sets SO_SNDBUF and SO_RCVBUF (the kernel
	// caps them at net.core.wmem_max and rmem_max), which turns off the
	// kernel's autotuning of both. The default (0, or negative) leaves
	// autotuning on, as Open MPI's btl tcp does (btl_tcp_sndbuf and
	// rcvbuf 0). Fixed 4 MiB buffers, this package's default until
	// 2026-11-27, made 2-rank all-gathers of 8-64 MiB over a veth pair
	// 1.9-2.5x slower in one set of runs, level in another, and were
	// measurably faster nowhere (docs/benchmarks.md, "Socket buffers";
	// measured before the ring's first step was paced, tcpRingWindow).
	BufSize int
	// Congestion is the TCP congestion control of the links (TCP_CONGESTION):
	// "" is DefaultTCPCongestion, TCPCongestionSystem keeps the system's
	// (net.ipv4.tcp_congestion_control), any other name must be one the
	// kernel lets this process pick (net.ipv4.tcp_allowed_congestion_control).
	// Why reno: tcp_cc.go.
	Congestion string
	// DialTimeout bounds dialing and authenticating one connection, on
	// either side (default 20 s): an incoming connection that has not
	// authenticated by then is dropped.
	DialTimeout time.Duration
	// SpinWait is how long the ring over TCP keeps looking at its sockets
	// without sleeping when neither can move, giving the CPU away between
	// looks, before it sleeps in poll(2): at most MaxTCPSpinWait; 0 is
	// DefaultTCPSpinWait (200 µs, as measured: see tcp_wait.go),
	// negative none.
	SpinWait time.Duration
	// MaxHandshakes caps the incoming connections authenticating at once
	// (default 64), so that idle unauthenticated connections cannot use up
	// the rank's descriptors and memory; over it, a new connection is
	// reset at once and its dialer, if a rank, retries.
	MaxHandshakes int
	// Log receives refused and failed incoming connections, at most one
	// line a second (default: standard error, which the agent forwards).
	Log func(string)
}

func (c TCPConfig) withDefaults() (TCPConfig, error) {
	if err := linkCheckRank(c.Rank, c.Size, c.Store); err != nil {
		return c, err
	}
	if len(c.Secret) < tcpMinSecret {
		return c, fmt.Errorf("secret of %d bytes is too short: want at least %d", len(c.Secret), tcpMinSecret)
	}
	if c.ConnsPerPeer == 0 {
		c.ConnsPerPeer = 1
	}
	if c.BufSize > 0 && (c.BufSize < MinTCPBufSize || c.BufSize > MaxTCPBufSize) {
		return c, fmt.Errorf("socket buffers of %d bytes: want %d to %d, or 0 for the kernel's autotuning", c.BufSize, MinTCPBufSize, MaxTCPBufSize)
	}
	if c.ConnsPerPeer < 1 || c.ConnsPerPeer > MaxTCPConnsPerPeer {
		return c, fmt.Errorf("%d connections per peer: want 1 to %d", c.ConnsPerPeer, MaxTCPConnsPerPeer)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultTCPDialTimeout
	}
	spin, err := tcpSpinWait(c.SpinWait)
	if err != nil {
		return c, err
	}
	c.SpinWait = spin
	if c.Congestion, err = tcpCongestion(c.Congestion); err != nil {
		return c, err
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = DefaultTCPHandshakes
	}
	if c.Advertise == "" {
		c.Advertise = tcpDefaultAdvertise()
	}
	if c.Bind == "" {
		c.Bind = tcpDefaultBind(c.Advertise)
	}
	if c.Log == nil {
		c.Log = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	return c, nil
}

// tcpDefaultBind listens on the advertised address when it is one of this
// host's (peers dial nothing else), else on every interface: the address
// may be a name, or one that a NAT maps to this host.
func tcpDefaultBind(advertise string) string {
	ip := net.ParseIP(advertise)
	if ip == nil {
		return ":0"
	}
	if ip.IsLoopback() {
		return net.JoinHostPort(ip.String(), "0")
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return net.JoinHostPort(ip.String(), "0")
		}
	}
	return ":0"
}

func tcpDefaultAdvertise() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

var _ GroupTransport = (*tcpTransport)(nil)

// tcpTransport listens for the lower ranks and dials the higher ones.
type tcpTransport struct {
	cfg  TCPConfig
	ln   *net.TCPListener
	done chan struct{} // closed by Close
	wg   sync.WaitGroup

	mu          sync.Mutex
	closed      bool
	links       map[linkID]*tcpLink
	handshaking map[*net.TCPConn]bool
	lastReject  error // why the last incoming connection was dropped
	log         tcpLog
	refused     atomic.Int64 // connections reset for want of a handshake slot
}

// linkID names a link: the peer and the group ("" for Connect's).
type linkID struct {
	peer  int
	group string
}

type tcpLink struct {
	connect  sync.Mutex     // serialises Connect for this link
	accepted []*net.TCPConn // authenticated streams from a lower rank (t.mu)
	n        int            // streams accepted so far (t.mu)
	ready    chan struct{}  // closed when all streams are accepted
	conn     *tcpConn       // the link, once made (t.mu)
}

// NewTCP listens on cfg.Bind, publishes "<prefix>/addr/<rank>" in the store
// and returns a Transport whose links are TCP connections: the lower rank of
// each pair dials, and every connection passes a mutual HMAC-SHA256
// challenge–response over the job secret before it carries data.
func NewTCP(ctx context.Context, cfg TCPConfig) (Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("comm: tcp: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("comm: tcp listen %s: %w", cfg.Bind, err)
	}
	t := &tcpTransport{cfg: cfg, ln: ln.(*net.TCPListener), done: make(chan struct{}),
		links: map[linkID]*tcpLink{}, handshaking: map[*net.TCPConn]bool{},
		log: tcpLog{out: cfg.Log, prefix: fmt.Sprintf("comm: tcp rank %d (%s): ", cfg.Rank, ln.Addr())}}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	addr := net.JoinHostPort(cfg.Advertise, port)
	if err := cfg.Store.Set(ctx, tcpAddrKey(cfg.Prefix, cfg.Rank), []byte(addr)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("comm: tcp publish address: %w", err)
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

func tcpAddrKey(prefix string, rank int) string { return fmt.Sprintf("%s/addr/%d", prefix, rank) }

// Connect returns the authenticated link to peer, dialing it when peer is
// the higher rank and waiting for its connections otherwise.
func (t *tcpTransport) Connect(ctx context.Context, peer int) (Conn, error) {
	return t.ConnectGroup(ctx, peer, "")
}

// ConnectGroup is Connect for group's own link to peer (see
// GroupTransport): separate connections, authenticated for that group.
func (t *tcpTransport) ConnectGroup(ctx context.Context, peer int, group string) (Conn, error) {
	if err := linkCheckPeer(peer, t.cfg.Rank, t.cfg.Size, group); err != nil {
		return nil, &LinkError{Transport: "tcp", Op: "connect", Peer: peer, Err: err}
	}
	ctx, cancel := linkContext(ctx, t.done)
	defer cancel()
	id := linkID{peer, group}
	t.mu.Lock()
	l := t.link(id)
	t.mu.Unlock()
	l.connect.Lock()
	defer l.connect.Unlock()
	t.mu.Lock()
	c := l.conn
	t.mu.Unlock()
	if c != nil {
		return c, nil
	}
	var ncs []*net.TCPConn
	var addr string
	var err error
	if peer > t.cfg.Rank {
		ncs, addr, err = t.dialAll(ctx, id)
	} else {
		ncs, err = t.awaitAccepted(ctx, l)
	}
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w (%v)", cause, err) // e.g. ErrLinkClosed, not "operation was canceled"
	}
	if err != nil {
		return nil, &LinkError{Transport: "tcp", Op: "connect", Peer: peer, Addr: addr, Err: err}
	}
	return t.adopt(l, peer, ncs)
}

// link returns the state of link id, made on first use; t.mu is held.
func (t *tcpTransport) link(id linkID) *tcpLink {
	l := t.links[id]
	if l == nil {
		l = &tcpLink{accepted: make([]*net.TCPConn, t.cfg.ConnsPerPeer), ready: make(chan struct{})}
		t.links[id] = l
	}
	return l
}

func (t *tcpTransport) adopt(l *tcpLink, peer int, ncs []*net.TCPConn) (Conn, error) {
	c := newTCPConn(peer, ncs)
	c.wait = tcpWaitConfig{budget: t.cfg.SpinWait, sys: osTCPSys{}}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, &LinkError{Transport: "tcp", Op: "connect", Peer: peer, Addr: c.addr, Err: ErrLinkClosed}
	}
	l.conn = c
	return c, nil
}

func (t *tcpTransport) dialAll(ctx context.Context, id linkID) ([]*net.TCPConn, string, error) {
	v, err := t.cfg.Store.Get(ctx, tcpAddrKey(t.cfg.Prefix, id.peer))
	if err != nil {
		return nil, "", fmt.Errorf("look up address: %w", err)
	}
	addr := string(v)
	ncs := make([]*net.TCPConn, 0, t.cfg.ConnsPerPeer)
	for s := range t.cfg.ConnsPerPeer {
		nc, err := t.dial(ctx, addr, &tcpHello{from: t.cfg.Rank, to: id.peer, group: id.group, stream: s, streams: t.cfg.ConnsPerPeer})
		if err != nil {
			for _, nc := range ncs {
				nc.Close()
			}
			return nil, addr, err
		}
		ncs = append(ncs, nc)
	}
	return ncs, addr, nil
}

// dial connects to addr and authenticates, retrying refused connections
// (the peer's listener is up before its address is published, so a refusal
// is transient at most) and connections reset before the challenge (the
// peer had too many connections authenticating) within DialTimeout.
func (t *tcpTransport) dial(ctx context.Context, addr string, h *tcpHello) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			tc := nc.(*net.TCPConn)
			if err = t.clientHandshake(ctx, tc, h); err == nil {
				t.tune(tc)
				return tc, nil
			}
			tc.Close()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, errTCPBusy) && !tcpReset(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

func (t *tcpTransport) awaitAccepted(ctx context.Context, l *tcpLink) ([]*net.TCPConn, error) {
	select {
	case <-l.ready:
	case <-ctx.Done():
		t.mu.Lock()
		why := t.lastReject
		t.mu.Unlock()
		if why != nil {
			return nil, fmt.Errorf("waiting for its connection: %w (last rejected connection: %v)", context.Cause(ctx), why)
		}
		return nil, fmt.Errorf("waiting for its connection: %w", context.Cause(ctx))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return l.accepted, nil
}

func (t *tcpTransport) tune(nc *net.TCPConn) {
	nc.SetNoDelay(true)
	if t.cfg.Congestion != TCPCongestionSystem {
		if rc, err := nc.SyscallConn(); err == nil {
			// Checked on a socket of its own by withDefaults; a refusal
			// now leaves the system's.
			rc.Control(func(fd uintptr) { setTCPCongestion(int(fd), t.cfg.Congestion) })
		}
	}
	if t.cfg.BufSize > 0 {
		nc.SetReadBuffer(t.cfg.BufSize)
		nc.SetWriteBuffer(t.cfg.BufSize)
	}
}

func (t *tcpTransport) acceptLoop() {
	defer t.wg.Done()
	for {
		nc, err := t.ln.AcceptTCP()
		if err != nil {
			select {
			case <-t.done:
				return
			case <-time.After(10 * time.Millisecond): // e.g. out of file descriptors
				continue
			}
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			nc.Close()
			return
		}
		if len(t.handshaking) >= t.cfg.MaxHandshakes {
			t.mu.Unlock()
			t.refuse(nc)
			continue
		}
		t.handshaking[nc] = true
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(nc)
	}
}

// serve authenticates one incoming connection and hands it to its peer
// slot; a connection that fails is dropped, logged and remembered for
// diagnostics.
func (t *tcpTransport) serve(nc *net.TCPConn) {
	defer t.wg.Done()
	h, err := t.serverHandshake(nc)
	t.admit(nc, h, err)
}

// admit ends nc's handshake: it delivers an authenticated stream, or
// drops nc, logging why (unless the transport is closing) before the
// close, so that whoever sees the close can see the line.
func (t *tcpTransport) admit(nc *net.TCPConn, h *tcpHello, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.handshaking, nc)
	if err == nil && t.closed {
		err = ErrLinkClosed
	}
	if err == nil {
		err = t.deliver(h, nc)
	}
	if err == nil {
		return
	}
	t.lastReject = fmt.Errorf("from %s: %w", nc.RemoteAddr(), err)
	if !t.closed {
		t.log.printf("dropped a connection from %s: %v", nc.RemoteAddr(), err)
	}
	nc.Close()
}

// refuse resets a connection at once, without reading it: the reset (not
// an orderly close, which means a refused hello) tells a dialing rank to
// retry.
func (t *tcpTransport) refuse(nc *net.TCPConn) {
	// Counted before the reset: whoever sees the reset sees the count.
	t.refused.Add(1)
	t.log.printf("refused a connection from %s: %d connections are authenticating already", nc.RemoteAddr(), t.cfg.MaxHandshakes)
	nc.SetLinger(0)
	nc.Close()
}

// deliver stores an authenticated stream; t.mu is held.
func (t *tcpTransport) deliver(h *tcpHello, nc *net.TCPConn) error {
	l := t.link(linkID{h.from, h.group})
	if l.accepted[h.stream] != nil || l.conn != nil {
		return fmt.Errorf("duplicate stream %d from rank %d (group %q)", h.stream, h.from, h.group)
	}
	t.tune(nc)
	l.accepted[h.stream] = nc
	if l.n++; l.n == len(l.accepted) {
		close(l.ready)
	}
	return nil
}

// Close stops listening and closes every link and pending connection.
func (t *tcpTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	var conns []io.Closer
	for nc := range t.handshaking {
		conns = append(conns, nc)
	}
	for _, l := range t.links {
		if l.conn != nil {
			conns = append(conns, l.conn)
		}
		for _, nc := range l.accepted {
			if nc != nil {
				conns = append(conns, nc)
			}
		}
	}
	t.mu.Unlock()
	err := t.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	t.wg.Wait()
	return err
}

// tcpLog writes at most one line a second, counting the lines it held
// back, so that a flood of bad connections cannot flood the rank's log.
type tcpLog struct {
	out    func(string)
	prefix string

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (l *tcpLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < time.Second {
		l.dropped++
		return
	}
	line := l.prefix + fmt.Sprintf(format, args...)
	if l.dropped > 0 {
		line += fmt.Sprintf(" (and %d more like it)", l.dropped)
	}
	l.last, l.dropped = now, 0
	l.out(line)
}
