package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. An error the server reports matches one of these with
// errors.Is, on the client as well as the server.
var (
	// ErrAuth means a side of a connection could not prove it knows the
	// job's secret.
	ErrAuth = errors.New("authentication failed")
	// ErrVersion means the peer speaks another protocol version.
	ErrVersion = errors.New("protocol version mismatch")
	// ErrBadRequest means a message was malformed or not allowed.
	ErrBadRequest = errors.New("bad request")
	// ErrTooLarge means a key, value, message or the store went over a limit.
	ErrTooLarge = errors.New("over a size limit")
	// ErrUnknownNode means a join named a node the round does not expect.
	ErrUnknownNode = errors.New("unknown node")
	// ErrDuplicateNode means a join named a node that has already joined.
	ErrDuplicateNode = errors.New("node already joined")
	// ErrBusy means the server has too much in flight to take the request.
	ErrBusy = errors.New("server busy")
	// ErrClosed means the client or server was closed.
	ErrClosed = errors.New("closed")
)

// Error codes on the wire ("code" of an error message).
const (
	codeAuth       = "auth"
	codeVersion    = "version"
	codeBadRequest = "bad_request"
	codeTooLarge   = "too_large"
	codeUnknown    = "unknown_node"
	codeDuplicate  = "duplicate_node"
	codeBusy       = "busy"
	codeClosed     = "closed"
	codeCancelled  = "cancelled"
)

var codeErrors = map[string]error{
	codeAuth:       ErrAuth,
	codeVersion:    ErrVersion,
	codeBadRequest: ErrBadRequest,
	codeTooLarge:   ErrTooLarge,
	codeUnknown:    ErrUnknownNode,
	codeDuplicate:  ErrDuplicateNode,
	codeBusy:       ErrBusy,
	codeClosed:     ErrClosed,
}

// ServerError is an error carried by an error message: the server's reason
// for refusing a request or a connection, or a malformed message.
type ServerError struct {
	Code    string // wire code, e.g. "unknown_node"
	Message string // human-readable, names the thing refused
}

// Error returns the message.
func (e *ServerError) Error() string { return e.Message }

// Is reports whether target is the sentinel error of e's code.
func (e *ServerError) Is(target error) bool {
	s, ok := codeErrors[e.Code]
	return ok && s == target
}

func errorf(code, format string, args ...any) *ServerError {
	return &ServerError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// errorMessage turns err into an error message for request id (0: the whole
// connection).
func errorMessage(id uint64, err error) *message {
	m := &message{Type: typeError, ID: id, Code: codeBadRequest, Error: err.Error()}
	var se *ServerError
	if errors.As(err, &se) {
		m.Code = se.Code
	}
	return m
}

// remoteError is the error an error message stands for.
func remoteError(m *message) error {
	msg := m.Error
	if msg == "" {
		msg = "server error (code " + clip(m.Code) + ")"
	}
	return &ServerError{Code: m.Code, Message: msg}
}

// RoundError is returned by Server.WaitRound when its context ends before
// every expected node joined.
type RoundError struct {
	Missing []string      // nodes that had not joined, in configured order
	After   time.Duration // how long WaitRound waited
	Err     error         // the context's cause
}

// Error names the missing nodes, e.g. "rendezvous: round timed out after
// 30s: missing worker-2, worker-3".
func (e *RoundError) Error() string {
	verb := "cancelled"
	if errors.Is(e.Err, context.DeadlineExceeded) {
		verb = "timed out"
	}
	return fmt.Sprintf("rendezvous: round %s after %v: missing %s", verb, roundDuration(e.After), listNames(e.Missing, 20))
}

// Unwrap returns the context's cause.
func (e *RoundError) Unwrap() error { return e.Err }

// roundDuration keeps a duration readable in a message: whole tenths of a
// second from one second on, milliseconds below.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// listNames joins names with ", ", at most n of them.
func listNames(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
