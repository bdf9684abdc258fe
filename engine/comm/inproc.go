package comm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// InProc is the in-process Transport NewInProc returns, one per rank, for
// tests. It is strict: a Send hands its bytes straight to the peer's Recv
// (no buffering, so an algorithm that only works because a transport
// buffers deadlocks here), and a Recv of a message of another length fails.
// Close simulates the death of the rank: every link of the transport closes,
// and its peers' pending and later calls fail with io.EOF. (This package's
// own tests can also stall a rank or let it die mid-operation: see
// export_test.go.) It implements GroupTransport, so communicators over it
// can Split. Its links only use channels, so it works in testing/synctest
// bubbles.
type InProc struct {
	net        *inprocNet
	rank, size int

	mu      sync.Mutex
	links   []*inprocConn
	closed  chan struct{}
	once    sync.Once
	stalled atomic.Bool  // Sends and Recvs block: the rank is stuck
	budget  atomic.Int64 // Sends left before the transport closes; < 0: no limit
}

// NewInProc returns connected in-process transports for ranks 0..size-1.
func NewInProc(size int) []Transport {
	n := &inprocNet{links: make(map[linkKey]*inprocLink)}
	trs := make([]Transport, size)
	for r := range trs {
		t := &InProc{net: n, rank: r, size: size, closed: make(chan struct{})}
		t.budget.Store(-1)
		trs[r] = t
	}
	return trs
}

type inprocNet struct {
	mu    sync.Mutex
	links map[linkKey]*inprocLink
}

type linkKey struct {
	group string
	a, b  int // a < b
}

// inprocLink joins ends 0 (the lower rank) and 1; dir[i] carries messages
// from end i. Each message is the sender's slice: the receiver copies it and
// acknowledges, and only then does the sender's Send return.
type inprocLink struct {
	up       chan struct{} // closed when both ends have connected
	arrived  [2]bool
	closed   chan struct{}
	once     sync.Once
	closedBy atomic.Int32 // end+1 of who closed first
	dir      [2]struct {
		msg chan []byte
		ack chan struct{}
	}
}

// Connect returns the link to peer in the default group.
func (t *InProc) Connect(ctx context.Context, peer int) (Conn, error) {
	return t.ConnectGroup(ctx, peer, "")
}

// ConnectGroup returns the link to peer in group, waiting for peer to ask
// for the same link.
func (t *InProc) ConnectGroup(ctx context.Context, peer int, group string) (Conn, error) {
	if peer < 0 || peer >= t.size || peer == t.rank {
		return nil, fmt.Errorf("inproc: rank %d: connect to invalid peer %d (size %d)", t.rank, peer, t.size)
	}
	end := 0
	key := linkKey{group, t.rank, peer}
	if peer < t.rank {
		end, key.a, key.b = 1, peer, t.rank
	}
	l, err := t.net.arrive(key, end)
	if err != nil {
		return nil, fmt.Errorf("inproc: rank %d: connect to %d: %w", t.rank, peer, err)
	}
	select {
	case <-l.up:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.closed:
		return nil, fmt.Errorf("inproc: rank %d: connect to %d: transport closed", t.rank, peer)
	}
	c := &inprocConn{t: t, l: l, end: end, peer: peer}
	t.mu.Lock()
	t.links = append(t.links, c)
	t.mu.Unlock()
	select {
	case <-t.closed: // closed while connecting: the new link dies with it
		c.Close()
	default:
	}
	return c, nil
}

func (n *inprocNet) arrive(key linkKey, end int) (*inprocLink, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[key]
	if l == nil {
		l = &inprocLink{up: make(chan struct{}), closed: make(chan struct{})}
		for i := range l.dir {
			l.dir[i].msg = make(chan []byte)
			l.dir[i].ack = make(chan struct{}, 1)
		}
		n.links[key] = l
	}
	if l.arrived[end] {
		return nil, fmt.Errorf("link in group %q already connected", key.group)
	}
	l.arrived[end] = true
	if l.arrived[1-end] {
		close(l.up)
	}
	return l, nil
}

// Close closes every link of the transport: the rank is dead to its peers.
func (t *InProc) Close() error {
	t.once.Do(func() { close(t.closed) })
	t.mu.Lock()
	links := t.links
	t.mu.Unlock()
	for _, c := range links {
		c.Close()
	}
	return nil
}

type inprocConn struct {
	t    *InProc
	l    *inprocLink
	end  int
	peer int
}

// Send hands b to the peer's Recv and returns once it has been copied.
func (c *inprocConn) Send(ctx context.Context, b []byte) error {
	if c.t.budget.Load() >= 0 && c.t.budget.Add(-1) < 0 {
		c.t.Close()
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	d := &c.l.dir[c.end]
	select {
	case d.msg <- b:
		<-d.ack // the receiver acknowledges as soon as it has copied
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.l.closed:
		return c.closedErr()
	}
}

// Recv receives the next message, which must be exactly len(b) bytes.
func (c *inprocConn) Recv(ctx context.Context, b []byte) error {
	if err := c.ready(ctx); err != nil {
		return err
	}
	d := &c.l.dir[1-c.end]
	select {
	case m := <-d.msg:
		ok := len(m) == len(b)
		if ok {
			copy(b, m)
		}
		d.ack <- struct{}{}
		if !ok {
			return fmt.Errorf("inproc: rank %d: message of %d bytes from rank %d, expected %d", c.t.rank, len(m), c.peer, len(b))
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.l.closed:
		return c.closedErr()
	}
}

// ready fails if the link is closed, and blocks while the transport stalls.
func (c *inprocConn) ready(ctx context.Context) error {
	select {
	case <-c.l.closed:
		return c.closedErr()
	default:
	}
	if !c.t.stalled.Load() {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.l.closed:
		return c.closedErr()
	}
}

func (c *inprocConn) closedErr() error {
	if int(c.l.closedBy.Load())-1 == c.end {
		return errInprocClosed
	}
	return fmt.Errorf("inproc: rank %d closed the link: %w", c.peer, io.EOF)
}

var errInprocClosed = errors.New("inproc: use of closed link")

// Close closes the link for both ends.
func (c *inprocConn) Close() error {
	c.l.once.Do(func() {
		c.l.closedBy.Store(int32(c.end + 1))
		close(c.l.closed)
	})
	return nil
}
