package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// DefaultAddr is where a server listens when Config.Addr is empty: loopback,
// with a port picked for the job. A job on several hosts sets Addr to an
// interface the other hosts reach (e.g. ":0").
const DefaultAddr = "127.0.0.1:0"

const (
	writeTimeout  = 10 * time.Second // bounds every write to a peer that does not read
	maxHandshakes = 64               // connections authenticating at once
	lingerTimeout = time.Second      // reading on after an error message, before closing
)

// Config configures a rendezvous server.
type Config struct {
	// Addr is the TCP host:port to listen on; port 0 picks a free port.
	// Empty means DefaultAddr.
	Addr string
	// Secret is the per-job secret (see NewSecret), known only to the
	// launcher and its agents. It never crosses the wire.
	Secret []byte
	// Nodes are the names of the expected nodes in hostfile order: a node's
	// rank is its index here. None means no membership round (store only).
	Nodes []string
	// Log, if set, receives one line per notable event: joins, the round
	// closing, refused connections and requests. Calls never overlap. To
	// use a *slog.Logger: func(s string) { logger.Info(s) }.
	Log func(string)
	// HandshakeTimeout bounds the authentication of a connection, so that a
	// silent client cannot hold a slot. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// Server is a rendezvous server: one membership round and one key-value
// store, for one job.
type Server struct {
	cfg    Config
	ln     net.Listener
	round  *round
	store  *store
	slots  chan struct{} // handshake slots
	ctx    context.Context
	cancel context.CancelFunc // ends every connection and wait

	logMu   sync.Mutex // one log line at a time, so Log need not be safe for concurrent use
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	serving bool
	wg      sync.WaitGroup
}

// Listen checks cfg and binds its address. Call Serve to accept connections.
func Listen(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if err := checkConfig(cfg); err != nil {
		return nil, fmt.Errorf("rendezvous: listen %s: %w", cfg.Addr, err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen %s: %w", cfg.Addr, err)
	}
	return newServer(cfg, ln), nil
}

func checkConfig(cfg Config) error {
	if err := checkSecret(cfg.Secret); err != nil {
		return err
	}
	seen := make(map[string]bool, len(cfg.Nodes))
	for _, n := range cfg.Nodes {
		if err := checkName(n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("node %s listed twice", n)
		}
		seen[n] = true
	}
	return nil
}

// newServer serves on an existing listener (tests use in-memory ones).
func newServer(cfg Config, ln net.Listener) *Server {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, ln: ln, store: newStore(),
		slots: make(chan struct{}, maxHandshakes),
		ctx:   ctx, cancel: cancel,
		conns: make(map[net.Conn]struct{}),
	}
	s.round = newRound(cfg.Nodes, s.logf)
	return s
}

// Addr returns the address the server listens on, with the port it picked.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve accepts connections until ctx ends or Close is called, then closes
// every connection and returns nil once their handlers are done. It returns
// an error if accepting fails otherwise, and may be called only once.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	again := s.serving
	s.serving = true
	s.mu.Unlock()
	if again {
		return fmt.Errorf("rendezvous: serve %s: already serving", s.Addr())
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			s.Close()
			return fmt.Errorf("rendezvous: accept %s: %w", s.Addr(), err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(nc)
		}()
	}
}

// Close stops the server: the listener, every connection, and every
// WaitRound. It is safe to call more than once.
func (s *Server) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.mu.Lock()
	for nc := range s.conns {
		nc.Close()
	}
	s.mu.Unlock()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// WaitRound returns the members of the round, in rank order, once every
// expected node has joined. When ctx ends first it returns a *RoundError
// naming the nodes still missing.
func (s *Server) WaitRound(ctx context.Context) ([]Member, error) {
	start := time.Now()
	select {
	case <-s.round.done:
		return cloneMembers(s.round.members), nil
	case <-ctx.Done():
		return nil, &RoundError{Missing: s.round.missing(), After: time.Since(start), Err: context.Cause(ctx)}
	case <-s.ctx.Done():
		return nil, fmt.Errorf("rendezvous: wait round: %w", ErrClosed)
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Log == nil {
		return
	}
	line := "rendezvous: " + fmt.Sprintf(format, args...)
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.cfg.Log(line)
}

// track registers a connection so Close can end it; false once closed.
func (s *Server) track(nc net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.conns, nc)
		return true
	}
	if s.ctx.Err() != nil {
		return false
	}
	s.conns[nc] = struct{}{}
	return true
}

// sconn is the server's side of one connection.
type sconn struct {
	s    *Server
	nc   net.Conn
	br   *bufio.Reader
	peer string // observed IP of the client
	wmu  sync.Mutex

	mu       sync.Mutex
	inflight map[uint64]context.CancelFunc
}

func (s *Server) serveConn(nc net.Conn) {
	defer nc.Close()
	if !s.track(nc, true) {
		return
	}
	defer s.track(nc, false)
	c := &sconn{s: s, nc: nc, br: bufio.NewReader(nc), peer: observedIP(nc.RemoteAddr()), inflight: map[uint64]context.CancelFunc{}}
	select {
	case s.slots <- struct{}{}:
	default:
		c.refuse(errorf(codeBusy, "too many connections authenticating at once; retry"))
		return
	}
	err := c.authenticate(s.cfg.HandshakeTimeout)
	<-s.slots
	if err != nil {
		c.refuse(err)
		return
	}
	c.serve()
}

// observedIP is the address other nodes most likely reach this peer by:
// the IP its connection came from.
func observedIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// refuse logs why a connection is refused and tells the client in an error
// message before the connection closes.
func (c *sconn) refuse(err error) {
	c.s.logf("refused %s: %v", c.nc.RemoteAddr(), err)
	var se *ServerError
	if errors.As(err, &se) {
		c.nc.SetDeadline(time.Time{})
		c.send(errorMessage(0, se))
		c.linger()
	}
}

// linger half-closes the connection and reads what the client is still
// sending for a moment, so that closing does not reset the connection
// before the client has read the error message.
func (c *sconn) linger() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	io.CopyN(io.Discard, c.nc, 2*MaxMessage)
}

// serve reads requests until the connection ends. Requests that may wait
// (get, barrier, join) run in their own goroutine, so one waiting request
// never blocks the others on the same connection.
func (c *sconn) serve() {
	ctx, cancel := context.WithCancel(c.s.ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for {
		line, err := readLine(c.br, MaxMessage)
		if errors.Is(err, errLineTooLong) {
			c.fatal(errorf(codeTooLarge, "message over %d bytes", MaxMessage))
			return
		}
		if err != nil {
			return // the client went away, or Close
		}
		m, err := decodeMessage(line)
		if err == nil {
			err = c.dispatch(ctx, m, &wg)
		}
		if err != nil {
			c.fatal(err)
			return
		}
	}
}

// fatal ends the connection after an error message about it.
func (c *sconn) fatal(err error) {
	c.s.logf("closing connection from %s: %v", c.nc.RemoteAddr(), err)
	c.send(errorMessage(0, err))
	c.linger()
}

func (c *sconn) dispatch(ctx context.Context, m *message, wg *sync.WaitGroup) error {
	switch m.Type {
	case typeCancel:
		c.mu.Lock()
		if cancel, ok := c.inflight[m.ID]; ok {
			cancel()
		}
		c.mu.Unlock()
	case typeSet, typeAdd, typeCAS:
		resp, err := c.s.handle(ctx, c, m)
		c.reply(m.ID, resp, err)
	case typeGet, typeBarrier, typeJoin:
		rctx, done, err := c.start(ctx, m.ID)
		if err != nil {
			c.reply(m.ID, nil, err)
			return nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done()
			resp, err := c.s.handle(rctx, c, m)
			c.reply(m.ID, resp, err)
		}()
	default:
		return errorf(codeBadRequest, "unexpected %s message from a client", m.Type)
	}
	return nil
}

// start registers a waiting request so that a cancel message can end it.
func (c *sconn) start(ctx context.Context, id uint64) (context.Context, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.inflight[id]; dup {
		return nil, nil, errorf(codeBadRequest, "request id %d is already in flight", id)
	}
	if len(c.inflight) >= maxInflight {
		return nil, nil, errorf(codeBusy, "over %d waiting requests on one connection", maxInflight)
	}
	rctx, cancel := context.WithCancel(ctx)
	c.inflight[id] = cancel
	return rctx, func() {
		c.mu.Lock()
		delete(c.inflight, id)
		c.mu.Unlock()
		cancel()
	}, nil
}

func (c *sconn) reply(id uint64, resp *message, err error) {
	if err != nil {
		switch {
		case errors.Is(err, context.Canceled) && c.s.ctx.Err() != nil:
			err = errorf(codeClosed, "server closed")
		case errors.Is(err, context.Canceled):
			err = errorf(codeCancelled, "request cancelled")
		}
		c.send(errorMessage(id, err))
		return
	}
	resp.Type, resp.ID = typeOK, id
	c.send(resp)
}

// send writes one message; a write that fails ends the connection, since a
// partly written line leaves the stream out of step.
func (c *sconn) send(m *message) error {
	b, err := encodeMessage(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.nc.Write(b); err != nil {
		c.nc.Close()
		return err
	}
	return nil
}

// handle runs one request and returns the result fields of its reply.
func (s *Server) handle(ctx context.Context, c *sconn, m *message) (*message, error) {
	switch m.Type {
	case typeSet:
		return &message{}, s.store.set(m.Key, m.Value)
	case typeGet:
		v, err := s.store.get(ctx, m.Key)
		return &message{Value: v}, err
	case typeAdd:
		n, err := s.store.add(m.Key, m.Delta)
		return &message{Count: n}, err
	case typeCAS:
		ok, cur, err := s.store.cas(m.Key, m.Old, m.Value)
		return &message{Swapped: ok, Value: cur}, err
	case typeBarrier:
		return &message{}, s.store.barrier(ctx, m.Name, m.N)
	case typeJoin:
		rank, members, err := s.round.join(ctx, Member{Name: m.Name, Addr: c.peer, Facts: m.Facts})
		if err != nil && !errors.Is(err, context.Canceled) {
			s.logf("refused join of %q from %s: %v", m.Name, c.nc.RemoteAddr(), err)
		}
		return &message{Rank: rank, Members: members}, err
	}
	return nil, errorf(codeBadRequest, "unexpected %s", m.Type)
}
