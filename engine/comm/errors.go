package comm

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrClosed is the cause of every error from a Communicator after Close.
var ErrClosed = errors.New("communicator closed")

// ErrAborted is the cause of every error from a Communicator after one of
// its operations failed: the failure left its links in an unknown state, so
// the communicator closed them (which makes its peers fail promptly instead
// of waiting for their timeout). Build a new communicator to go on.
var ErrAborted = errors.New("communicator aborted by an earlier error")

// ErrTimeout is the cause in a PeerError when the peer made no progress
// within Options.Timeout: it is stuck, dead without its links closing, or
// not taking part in the operation.
var ErrTimeout = errors.New("timed out")

// errOpTimeout is the cancellation cause of an operation's context when
// Options.Timeout fires, to tell it from the caller's own deadline.
var errOpTimeout = errors.New("comm: operation timeout")

// OpError is the error every Communicator operation returns. It names the
// communicator, the calling rank and the operation with its sequence number:
//
//	comm: rank 2: all_reduce #17: peer rank 3 called reduce_scatter (count 1000, not 1024)
type OpError struct {
	Comm string // Options.Name; empty for an unnamed communicator
	Rank int    // the calling rank, within the communicator
	Op   string // all_reduce, reduce_scatter, ..., send, recv, connect, split
	Seq  int64  // collective (or per-peer send/recv) sequence number; -1 if none
	Err  error  // *PeerError, *MismatchError, ErrAborted, ErrClosed, or an argument error
}

// Error formats the error as "comm: [name: ]rank R: op #seq: cause".
func (e *OpError) Error() string {
	var sb strings.Builder
	sb.WriteString("comm: ")
	if e.Comm != "" {
		sb.WriteString(e.Comm)
		sb.WriteString(": ")
	}
	fmt.Fprintf(&sb, "rank %d: %s", e.Rank, e.Op)
	if e.Seq >= 0 {
		fmt.Fprintf(&sb, " #%d", e.Seq)
	}
	sb.WriteString(": ")
	sb.WriteString(e.Err.Error())
	return sb.String()
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// PeerError is a failure of the link to one peer: it closed (the peer
// exited or aborted), failed, or made no progress in time (Err wraps
// ErrTimeout).
type PeerError struct {
	Peer  int    // rank within the communicator
	World int    // rank in the world communicator; -1 if this is one
	Host  string // from Options.Hosts; empty if unknown
	Err   error
}

// Error formats the error as "peer rank P (world rank W, host H): cause".
func (e *PeerError) Error() string {
	return peerName(e.Peer, e.World, e.Host) + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// MismatchError reports that a peer's call does not match this rank's: a
// different collective, sequence number, element count, dtype, reduction
// op, root or configuration. It is raised from the message header, before
// any data of the call is used.
type MismatchError struct {
	Peer   int    // rank within the communicator
	World  int    // rank in the world communicator; -1 if this is one
	Host   string // from Options.Hosts; empty if unknown
	PeerOp string // what the peer called, e.g. "reduce_scatter"
	Detail string // e.g. "called reduce_scatter (count 1000, not 1024)"
}

// Error formats the error as "peer rank P called X (details)".
func (e *MismatchError) Error() string {
	return peerName(e.Peer, e.World, e.Host) + " " + e.Detail
}

// peerName formats "peer rank 3 (world rank 7, host b)", leaving out what
// is unknown or redundant.
func peerName(peer, world int, host string) string {
	var extra []string
	if world >= 0 && world != peer {
		extra = append(extra, fmt.Sprintf("world rank %d", world))
	}
	if host != "" {
		extra = append(extra, "host "+host)
	}
	s := fmt.Sprintf("peer rank %d", peer)
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

// timeoutError is the cause of a PeerError when Options.Timeout fired.
type timeoutError struct {
	d       time.Duration
	joining bool // the peer had not yet joined the call
}

func (e timeoutError) Error() string {
	if e.joining {
		return fmt.Sprintf("timed out after %v waiting for it to join the call (stuck, dead, or not calling it)", e.d)
	}
	return fmt.Sprintf("timed out after %v waiting for it in the middle of the call (it, or a rank it waits for, is stuck)", e.d)
}

func (e timeoutError) Unwrap() error { return ErrTimeout }
