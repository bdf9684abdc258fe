package comm

import "context"

// Conn is a reliable, ordered, message-preserving link to one peer rank.
// Messages are opaque bytes; the collective layer frames them. A Conn is used
// by at most one sender goroutine and one receiver goroutine at a time.
type Conn interface {
	// Send writes one message. b may be reused as soon as Send returns.
	Send(ctx context.Context, b []byte) error
	// Recv reads the next message into b. The message must be exactly
	// len(b) bytes long; a message of another length is an error (it means
	// the two ranks disagree about the call, and is reported as such).
	Recv(ctx context.Context, b []byte) error
	// Close releases the link. Pending and later calls on either end fail.
	Close() error
}

// Transport connects one rank to the other ranks of a job.
type Transport interface {
	// Connect returns the link to peer (0 <= peer < Size, peer != Rank).
	// Both ends call Connect for each other; it blocks until the link is up
	// or ctx ends.
	Connect(ctx context.Context, peer int) (Conn, error)
	// Close releases everything the transport holds.
	Close() error
}

// Store is the key-value store ranks meet through: the job's rendezvous
// store (rendezvous.Client satisfies it), or an in-process one in tests.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	// Get waits until key exists.
	Get(ctx context.Context, key string) ([]byte, error)
}
