package rendezvous

import (
	"context"
	"fmt"
	"net"
	"strings"
)

// Store is the key-value store the ranks of a job meet through. Both
// backends give it the same semantics (PROTOCOL.md, "store semantics"): Get
// waits for its key, Add keeps a counter as decimal text, CompareAndSet
// treats a missing key as an empty old value, and a Barrier's name can be
// used again once it opens.
type Store interface {
	// Set stores value under key, waking every Get waiting for key.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns the value of key, waiting until it exists or ctx ends.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add atomically adds delta to the counter at key and returns the sum.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareAndSet sets key to value if it holds old; it returns whether
	// it swapped and the value key now holds (nil if missing).
	CompareAndSet(ctx context.Context, key string, old, value []byte) (swapped bool, current []byte, err error)
	// Barrier returns once n clients reached the barrier called name.
	Barrier(ctx context.Context, name string, n int) error
}

// Backend is one node's (or rank's) connection to where the nodes of a job
// meet: the membership round, the store, and liveness. *Client (the
// launcher's built-in TCP server, "c10d") and *EtcdClient ("etcd")
// implement it; Open picks one from an endpoint.
type Backend interface {
	Store
	// Join joins the membership round as node name with facts (marshalled
	// to a JSON object) and returns every member and this node's rank, the
	// index of name in the job's node order, once all nodes joined.
	Join(ctx context.Context, name string, facts any) (*Round, error)
	// Watch blocks until this node loses the rendezvous (its connection or
	// its lease), a member of the closed round is lost (a *LostError
	// naming it), or ctx ends; it returns why.
	Watch(ctx context.Context) error
	// LocalAddr is this host's address on the route to the rendezvous,
	// which is usually the one its peers reach it at.
	LocalAddr() net.Addr
	// Close ends the connection; a join not yet in a closed round is
	// withdrawn.
	Close() error
}

// Both backends are Backends.
var (
	_ Backend = (*Client)(nil)
	_ Backend = (*EtcdClient)(nil)
)

// Backend names, as torchrun's --rdzv-backend spells them. "c10d" and
// "static" both mean gtrain's own TCP rendezvous, which the launcher runs.
const (
	BackendC10d   = "c10d"
	BackendStatic = "static"
	BackendEtcd   = "etcd"
)

// etcdScheme starts an etcd endpoint (see ParseEtcdEndpoint); any other
// endpoint is the HOST:PORT of a built-in server.
const etcdScheme = "etcd://"

// IsEtcd reports whether endpoint names an etcd rendezvous.
func IsEtcd(endpoint string) bool { return strings.HasPrefix(endpoint, etcdScheme) }

// Open connects to the rendezvous at endpoint with the job's secret: an
// etcd endpoint ("etcd://HOST:PORT/gtrain/RUN/ATTEMPT?...", see
// ParseEtcdEndpoint) through etcd's client, anything else as HOST:PORT of
// the launcher's built-in server (Dial).
func Open(ctx context.Context, endpoint string, secret []byte) (Backend, error) {
	if !IsEtcd(endpoint) {
		c, err := Dial(ctx, endpoint, secret)
		if err != nil {
			return nil, err // a nil *Client must not become a non-nil Backend
		}
		return c, nil
	}
	cfg, err := ParseEtcdEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	return OpenEtcd(ctx, cfg, secret)
}

// Watch blocks until the connection to the server ends or ctx does. The
// built-in server keeps no liveness of its own once the round closed: the
// launcher's agent heartbeats do that.
func (c *Client) Watch(ctx context.Context) error {
	select {
	case <-c.done:
		return fmt.Errorf("rendezvous: %s: %w", c.addr, c.err)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// LostError is a member of a closed round that the rendezvous lost: its
// lease expired, because its node stopped or lost the network.
type LostError struct {
	Endpoint string // the rendezvous that lost it
	Node     string // the member's name
	Reason   string // e.g. "its lease expired"
}

// Error names the node, e.g. "rendezvous: etcd 10.0.0.1:2379: node
// worker-2 lost: its lease expired (no keepalive for 10s)".
func (e *LostError) Error() string {
	return fmt.Sprintf("rendezvous: etcd %s: node %s lost: %s", e.Endpoint, e.Node, e.Reason)
}
