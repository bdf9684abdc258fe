package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Options configure a Communicator. The zero value is usable.
type Options struct {
	// Name appears in errors ("comm: dp: rank 2: ..."). Split names its
	// sub-groups "<name>/<color>" ("world/<color>" for an unnamed parent).
	Name string
	// Timeout bounds every operation (and the connecting in New): a peer
	// that has not done its part by then is reported as stuck, by rank and
	// host. It must exceed the longest legitimate operation. Default 60s.
	Timeout time.Duration
	// Algorithm forces the algorithm: "auto" (or ""), "ring", "rd"
	// (recursive doubling), "tree" (binomial) or "direct" (every rank with
	// every other; single copy within a host). See algorithms.go for what
	// each means per collective. Every rank must use the same value (a
	// difference is reported as a mismatch).
	Algorithm string
	// Hosts names the host of each rank, for errors; may be nil or short.
	Hosts []string
	// RingThreshold is the message size in bytes from which "auto" uses the
	// bandwidth-optimal ring instead of the latency-optimal algorithms.
	// Default 64 KiB.
	RingThreshold int
	// ChunkBytes is the largest transport message: payloads are cut into
	// chunks of this size, and the ring pipelines chunk by chunk. Default
	// 256 KiB. Every rank must use the same value.
	ChunkBytes int
}

const (
	defaultTimeout       = 60 * time.Second
	defaultRingThreshold = 64 << 10
	defaultChunkBytes    = 256 << 10
)

// Communicator is a group of ranks that run collective operations together:
// one per process group (the world, and the TP/PP/DP groups Split makes).
// Every rank of the group must issue the same collectives, with matching
// arguments, in the same order; a mismatch is detected and reported.
//
// Operations execute one at a time, in the order they were issued, whether
// blocking or asynchronous (the *Async methods). Any failure (a dead, stuck
// or mismatched peer, a cancelled context, a bad argument) aborts the
// communicator: it closes its links, so its peers fail promptly too, and
// every later call returns ErrAborted. Methods are safe for concurrent use,
// but concurrent issuers get an arbitrary order, which must still be the
// same on every rank.
type Communicator struct {
	rank, size int
	tr         Transport
	opts       Options
	alg        algorithm
	tag        string // group name for GroupTransport; "" for a world
	world      []int  // group rank → world rank; nil in a world communicator
	conns      []Conn
	shm        []*shmConn // the links, when every one is shared memory (all ranks on this host); else nil
	hier       *hierarchy // set up by the first large all-reduce, reduce-scatter or all-gather; owned by the executing operation
	flight     flightRecorder

	mu          sync.Mutex
	queue       []*Handle
	busy        bool // an operation is executing or drain is running
	failed      error
	closed      bool
	connsClosed bool

	// Below: owned by whoever executes the current operation.
	seq     uint64
	p2pSent []uint64
	p2pRecv []uint64
	sent    []bool // header sent to peer in this operation
	got     []bool // header received from peer in this operation
	hdrIn   [][hdrSize]byte
	scratch [numSlots][]uint64
	pass    tcpPass // the TCP pass of the operation, its lists kept (tcp_pass.go)
}

// New connects rank (0 <= rank < size) to the other ranks of a group over
// tr, and returns the Communicator. Every rank calls New; it returns when
// all links are up, or fails after Options.Timeout naming the peers that
// did not come. The Communicator does not own tr: Close leaves it open.
func New(ctx context.Context, rank, size int, tr Transport, opts Options) (*Communicator, error) {
	c, err := newComm(ctx, rank, size, tr, opts)
	if err != nil {
		return nil, err
	}
	c.register()
	return c, nil
}

// newComm is New without adding the communicator to FlightRecords' list:
// Split adds its groups once it has told them their world ranks.
func newComm(ctx context.Context, rank, size int, tr Transport, opts Options) (*Communicator, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("comm: new: rank %d out of range for size %d", rank, size)
	}
	alg, err := parseAlgorithm(opts.Algorithm)
	if err != nil {
		return nil, fmt.Errorf("comm: new: %w", err)
	}
	opts = opts.withDefaults()
	c := &Communicator{
		rank: rank, size: size, tr: tr, opts: opts, alg: alg,
		conns:   make([]Conn, size),
		p2pSent: make([]uint64, size), p2pRecv: make([]uint64, size),
		sent: make([]bool, size), got: make([]bool, size),
		hdrIn: make([][hdrSize]byte, size),
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.RingThreshold <= 0 {
		o.RingThreshold = defaultRingThreshold
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = defaultChunkBytes
	}
	o.ChunkBytes = max(o.ChunkBytes, 8) // room for one element of every dtype
	o.Hosts = append([]string(nil), o.Hosts...)
	return o
}

// connect opens the links to every peer concurrently: Transport.Connect
// blocks until both ends ask, so a sequential loop could wait in a cycle.
func (c *Communicator) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, c.opts.Timeout, errOpTimeout)
	defer cancel()
	var fns []func(context.Context) error
	for peer := range c.size {
		if peer == c.rank {
			continue
		}
		fns = append(fns, func(pctx context.Context) error {
			conn, err := c.tr.Connect(pctx, peer)
			if err != nil {
				return c.joinErr(ctx, peer, err)
			}
			c.conns[peer] = conn
			return nil
		})
	}
	if err := par(ctx, fns...); err != nil {
		c.closeConns()
		return &OpError{Comm: c.opts.Name, Rank: c.rank, Op: "connect", Seq: -1, Err: err}
	}
	// In a group either all ranks share a host or each has a peer on
	// another, so every rank of a group gets the same answer.
	c.shm = shmLinks(c.conns)
	return nil
}

// Rank returns this rank's index in the group.
func (c *Communicator) Rank() int { return c.rank }

// Size returns the number of ranks in the group.
func (c *Communicator) Size() int { return c.size }

// Name returns Options.Name.
func (c *Communicator) Name() string { return c.opts.Name }

// WorldRank returns the world rank of the group's rank r: r itself in a
// communicator from New, its rank in the ancestor world after Split.
func (c *Communicator) WorldRank(r int) int {
	if c.world == nil {
		return r
	}
	return c.world[r]
}

// Close closes the communicator's links; pending and later operations fail
// with ErrClosed. It does not close the Transport.
func (c *Communicator) Close() error {
	c.unregister()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.closeConns()
	return nil
}

func (c *Communicator) closeConns() {
	c.mu.Lock()
	done := c.connsClosed
	c.connsClosed = true
	c.mu.Unlock()
	if done {
		return
	}
	for _, cn := range c.conns {
		if cn != nil {
			cn.Close()
		}
	}
	c.closeHierarchy()
}

// abort records the first failure and closes the links, so that peers
// blocked on this rank fail now rather than at their timeout.
func (c *Communicator) abort(err error) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = err
	}
	c.mu.Unlock()
	c.closeConns()
}

// usable returns why the communicator cannot run operations, or nil.
func (c *Communicator) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClosed
	case c.failed != nil:
		return fmt.Errorf("%w: %w", ErrAborted, c.failed)
	}
	return nil
}

func (c *Communicator) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// peerErr wraps an error from the link to peer. ctx is the operation's
// context: when its Timeout fired, the error becomes a timeout naming peer;
// when the caller cancelled it, the caller's error is returned as is.
func (c *Communicator) peerErr(ctx context.Context, peer int, err error) error {
	var me *MismatchError
	var pe *PeerError
	if errors.As(err, &me) || errors.As(err, &pe) {
		return err
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errOpTimeout):
		err = timeoutError{d: c.opts.Timeout}
	case cause != nil:
		return cause
	}
	world, host := c.describe(peer)
	return &PeerError{Peer: peer, World: world, Host: host, Err: err}
}

// joinErr is peerErr for a peer that has not yet joined the call (the
// header exchange, or connecting): a timeout says so.
func (c *Communicator) joinErr(ctx context.Context, peer int, err error) error {
	err = c.peerErr(ctx, peer, err)
	var pe *PeerError
	if te, ok := errors.AsType[timeoutError](err); ok && errors.As(err, &pe) {
		te.joining = true
		pe.Err = te
	}
	return err
}

// describe returns the world rank (-1 in a world communicator) and host of
// peer, as far as known.
func (c *Communicator) describe(peer int) (world int, host string) {
	world = -1
	if c.world != nil {
		world = c.world[peer]
	}
	if peer < len(c.opts.Hosts) {
		host = c.opts.Hosts[peer]
	}
	return world, host
}

// Handle is an operation started by an *Async method.
type Handle struct {
	done chan struct{}
	err  error
	run  func() error
}

// Wait blocks until the operation has finished and returns its error, or
// until ctx ends and returns ctx's error; the operation then goes on, and
// its buffers stay in use until Done is closed.
func (h *Handle) Wait(ctx context.Context) error {
	select {
	case <-h.done: // finished while the caller computed: no time blocked
		return h.err
	default:
	}
	defer countBlocked(time.Now())
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed when the operation has finished.
func (h *Handle) Done() <-chan struct{} { return h.done }

// async queues run behind the operations already issued and returns at
// once. A goroutine drains the queue while it is not empty.
func (c *Communicator) async(run func() error) *Handle {
	h := &Handle{done: make(chan struct{}), run: run}
	c.mu.Lock()
	c.queue = append(c.queue, h)
	if !c.busy {
		c.busy = true
		go c.drain()
	}
	c.mu.Unlock()
	return h
}

// do runs a blocking operation: on the caller's goroutine when nothing is
// queued or executing (no goroutine hand-off on the latency path), else
// queued behind the earlier operations.
func (c *Communicator) do(run func() error) error {
	defer countBlocked(time.Now())
	c.mu.Lock()
	if c.busy {
		c.mu.Unlock()
		h := c.async(run)
		<-h.done // every operation ends by its own context and timeout
		return h.err
	}
	c.busy = true
	c.mu.Unlock()
	err := run()
	c.mu.Lock()
	if len(c.queue) > 0 {
		go c.drain()
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	return err
}

func (c *Communicator) drain() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.busy = false
			c.mu.Unlock()
			return
		}
		h := c.queue[0]
		c.queue = c.queue[1:]
		c.mu.Unlock()
		h.err = h.run()
		close(h.done)
	}
}
