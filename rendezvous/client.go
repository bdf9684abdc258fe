package rendezvous

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Client is an authenticated connection to a rendezvous server. It is safe
// for concurrent use, and requests run concurrently: a Get waiting for its
// key does not hold up a Set on the same Client.
type Client struct {
	addr   string
	nc     net.Conn
	br     *bufio.Reader
	wmu    sync.Mutex
	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]chan *message
	err     error         // why the connection ended; set before done closes
	done    chan struct{} // closed when the connection ends
	readers sync.WaitGroup
}

// Dial connects to the server at addr and runs the mutual authentication
// with secret. It fails with an error matching ErrAuth if the server does
// not prove it knows the secret, or refuses this client's proof. The
// handshake ends by ctx's deadline or DefaultHandshakeTimeout, the sooner.
func Dial(ctx context.Context, addr string, secret []byte) (*Client, error) {
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("rendezvous: dial %s: %w", addr, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: dial %s: %w", addr, err)
	}
	return newClient(ctx, nc, addr, secret)
}

// newClient authenticates over an open connection (tests use in-memory
// ones) and starts reading replies.
func newClient(ctx context.Context, nc net.Conn, addr string, secret []byte) (*Client, error) {
	nc.SetDeadline(time.Now().Add(DefaultHandshakeTimeout))
	// A deadline in the past ends a handshake blocked in I/O when ctx ends.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	br := bufio.NewReader(nc)
	err := clientHandshake(nc, br, secret)
	// Once ctx has ended the AfterFunc may still set a past deadline, and
	// ctx is the reason a blocked handshake failed: report it.
	if !stop() || (err != nil && ctx.Err() != nil) {
		err = fmt.Errorf("handshake: %w", context.Cause(ctx))
	}
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("rendezvous: dial %s: %w", addr, err)
	}
	c := &Client{addr: addr, nc: nc, br: br, pending: map[uint64]chan *message{}, done: make(chan struct{})}
	c.readers.Add(1)
	go c.readLoop()
	return c, nil
}

// Close ends the connection. Requests in flight fail with ErrClosed; on the
// server, a join not yet in a closed round is withdrawn.
func (c *Client) Close() error {
	c.fail(fmt.Errorf("client %w", ErrClosed))
	c.readers.Wait()
	return nil
}

// Join joins the membership round as node name with facts, which must
// marshal to a JSON object (e.g. a Facts, or a map with more fields). It
// blocks until every expected node has joined or ctx ends.
func (c *Client) Join(ctx context.Context, name string, facts any) (*Round, error) {
	raw, err := json.Marshal(facts)
	if err == nil {
		err = checkName(name)
	}
	if err == nil {
		err = checkFacts(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: join %s: %w", name, err)
	}
	resp, err := c.call(ctx, "join", name, &message{Type: typeJoin, Name: name, Facts: raw})
	if err != nil {
		return nil, err
	}
	if resp.Rank < 0 || resp.Rank >= len(resp.Members) || resp.Members[resp.Rank].Name != name {
		return nil, fmt.Errorf("rendezvous: join %s: reply gives rank %d of %d members: %w", name, resp.Rank, len(resp.Members), ErrBadRequest)
	}
	return &Round{Rank: resp.Rank, Members: resp.Members}, nil
}

// Set stores value under key, waking every Get waiting for key.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	_, err := c.keyCall(ctx, "set", key, &message{Type: typeSet, Value: value})
	return err
}

// Get returns the value of key, waiting until some client sets it or ctx
// ends. A counter made by Add reads as decimal text.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := c.keyCall(ctx, "get", key, &message{Type: typeGet})
	if err != nil {
		return nil, err
	}
	return resp.Value, nil
}

// Add atomically adds delta to the counter at key (a missing key counts as
// 0) and returns the new value.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	resp, err := c.keyCall(ctx, "add", key, &message{Type: typeAdd, Delta: delta})
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// CompareAndSet atomically sets key to value if its current value equals
// old; a missing key equals an empty old. It returns whether it swapped and
// the value key now holds (nil if key is missing).
func (c *Client) CompareAndSet(ctx context.Context, key string, old, value []byte) (swapped bool, current []byte, err error) {
	resp, err := c.keyCall(ctx, "cas", key, &message{Type: typeCAS, Old: old, Value: value})
	if err != nil {
		return false, nil, err
	}
	return resp.Swapped, resp.Value, nil
}

// Barrier returns once n clients have reached the barrier called name, or
// when ctx ends (and this client leaves the barrier). Every client must pass
// the same n. After it opens, the name can be used again.
func (c *Client) Barrier(ctx context.Context, name string, n int) error {
	target := fmt.Sprintf("%q", clip(name))
	req := &message{Type: typeBarrier, Name: name, N: n}
	err := checkBarrier(&message{ID: 1, Name: name, N: n})
	if err == nil && !utf8.ValidString(name) {
		err = fmt.Errorf("barrier name is not valid UTF-8: %w", ErrBadRequest)
	}
	if err != nil {
		return fmt.Errorf("rendezvous: barrier %s: %w", target, err)
	}
	_, err = c.call(ctx, "barrier", target, req)
	return err
}

// keyCall checks key and the value sizes before sending, so the caller gets
// the limit error rather than a closed connection.
func (c *Client) keyCall(ctx context.Context, op, key string, req *message) (*message, error) {
	target := fmt.Sprintf("%q", clip(key))
	req.Key = key
	err := checkKeyValue(&message{ID: 1, Key: key, Value: req.Value, Old: req.Old})
	if err == nil && !utf8.ValidString(key) {
		err = fmt.Errorf("key is not valid UTF-8: %w", ErrBadRequest)
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %s %s: %w", op, target, err)
	}
	return c.call(ctx, op, target, req)
}

func (c *Client) call(ctx context.Context, op, target string, req *message) (*message, error) {
	resp, err := c.roundTrip(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %s %s: %w", op, target, err)
	}
	return resp, nil
}

// roundTrip sends req and waits for its reply. When ctx ends first it tells
// the server to drop the request.
func (c *Client) roundTrip(ctx context.Context, req *message) (*message, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	req.ID = c.nextID.Add(1)
	ch := make(chan *message, 1)
	c.mu.Lock()
	if c.err != nil {
		defer c.mu.Unlock()
		return nil, c.err
	}
	c.pending[req.ID] = ch
	c.mu.Unlock()
	if err := c.send(req); err != nil {
		c.forget(req.ID)
		return nil, err
	}
	select {
	case m := <-ch:
		if m.Type == typeError {
			return nil, remoteError(m)
		}
		return m, nil
	case <-c.done:
		return nil, c.err
	case <-ctx.Done():
		c.forget(req.ID)
		c.send(&message{Type: typeCancel, ID: req.ID})
		return nil, context.Cause(ctx)
	}
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// send writes one message. A failed write ends the connection: a partly
// written line leaves the stream out of step.
func (c *Client) send(m *message) error {
	b, err := encodeMessage(m)
	if err != nil {
		return err
	}
	if len(b)-1 > MaxMessage {
		return fmt.Errorf("message of %d bytes is over the limit of %d: %w", len(b)-1, MaxMessage, ErrTooLarge)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.nc.Write(b); err != nil {
		err = fmt.Errorf("send to %s: %w", c.addr, err)
		c.fail(err)
		return err
	}
	return nil
}

// fail ends the connection for err; the first reason stays.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	c.mu.Unlock()
	c.nc.Close()
}

// readLoop hands each reply to the request waiting for it, until the
// connection ends.
func (c *Client) readLoop() {
	defer c.readers.Done()
	for {
		m, err := c.readMessage()
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		ch := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m // buffered; a reply to a forgotten request is dropped
		}
	}
}

func (c *Client) readMessage() (*message, error) {
	line, err := readLine(c.br, maxReplyLine)
	if err != nil {
		return nil, fmt.Errorf("connection to %s lost: %w", c.addr, err)
	}
	m, err := decodeMessage(line)
	switch {
	case err != nil:
		return nil, fmt.Errorf("bad message from %s: %w", c.addr, err)
	case m.Type == typeError && m.ID == 0:
		return nil, fmt.Errorf("server %s ended the connection: %w", c.addr, remoteError(m))
	case m.Type != typeOK && m.Type != typeError:
		return nil, fmt.Errorf("unexpected %s message from %s: %w", m.Type, c.addr, ErrBadRequest)
	}
	return m, nil
}

// LocalAddr is this end's address of the connection: the interface this
// host reaches the server through, which is usually the one its peers
// reach it through too.
func (c *Client) LocalAddr() net.Addr { return c.nc.LocalAddr() }
