package rendezvous

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode"
)

// Version is the protocol version carried in every message's "v" field.
// Either side refuses a message of another version.
const Version = 1

// Limits on what a client may send, so that a bad client cannot exhaust the
// server's memory. PROTOCOL.md explains each.
const (
	MaxKey     = 512       // bytes in a store key or barrier name
	MaxValue   = 1 << 20   // bytes in a store value (before base64)
	MaxMessage = 3 << 20   // bytes in one request line, newline excluded
	MaxName    = 255       // bytes in a node name
	MaxFacts   = 16 << 10  // bytes in a node's facts object
	MaxBarrier = 1 << 20   // largest n a barrier may wait for
	MaxStore   = 256 << 20 // bytes of keys and values the store holds in all
)

const (
	nonceLen         = 32       // bytes in each handshake nonce
	macLen           = 32       // bytes in an HMAC-SHA256 proof
	maxHandshakeLine = 4 << 10  // bytes in a handshake line
	maxReplyLine     = 64 << 20 // bytes in a reply the client accepts from an authenticated server
	maxInflight      = 256      // waiting requests (get, barrier, join) per connection
)

// Message types. Requests carry a non-zero id; replies echo it.
const (
	typeHello     = "hello"     // client → server: client nonce
	typeChallenge = "challenge" // server → client: server nonce, server proof
	typeAuth      = "auth"      // client → server: client proof
	typeWelcome   = "welcome"   // server → client: authenticated
	typeJoin      = "join"      // request: name, facts
	typeSet       = "set"       // request: key, value
	typeGet       = "get"       // request: key
	typeAdd       = "add"       // request: key, delta
	typeCAS       = "cas"       // request: key, old, value
	typeBarrier   = "barrier"   // request: name, n
	typeCancel    = "cancel"    // client → server: give up request id (no reply)
	typeOK        = "ok"        // reply: the result fields of the request
	typeError     = "error"     // reply (id) or connection-level error (no id)
)

// message is every protocol message, in both directions; which fields are
// set depends on Type (see PROTOCOL.md). []byte fields are base64 in JSON.
type message struct {
	V       int             `json:"v"`
	Type    string          `json:"type"`
	ID      uint64          `json:"id,omitempty"`
	Nonce   []byte          `json:"nonce,omitempty"`
	MAC     []byte          `json:"mac,omitempty"`
	Name    string          `json:"name,omitempty"`
	Facts   json.RawMessage `json:"facts,omitempty"`
	Key     string          `json:"key,omitempty"`
	Value   []byte          `json:"value,omitempty"`
	Old     []byte          `json:"old,omitempty"`
	Delta   int64           `json:"delta,omitempty"`
	N       int             `json:"n,omitempty"`
	Count   int64           `json:"count,omitempty"`
	Swapped bool            `json:"swapped,omitempty"`
	Rank    int             `json:"rank,omitempty"`
	Members []Member        `json:"members,omitempty"`
	Code    string          `json:"code,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// checks validates the fields each message type needs.
var checks = map[string]func(*message) error{
	typeHello:     func(m *message) error { return checkLen("nonce", m.Nonce, nonceLen) },
	typeChallenge: checkChallenge,
	typeAuth:      func(m *message) error { return checkLen("mac", m.MAC, macLen) },
	typeWelcome:   func(*message) error { return nil },
	typeJoin:      checkJoin,
	typeSet:       checkKeyValue,
	typeGet:       checkKeyValue,
	typeAdd:       checkKeyValue,
	typeCAS:       checkKeyValue,
	typeBarrier:   checkBarrier,
	typeCancel:    checkID,
	typeOK:        checkID,
	typeError:     func(*message) error { return nil },
}

// decodeMessage parses one protocol line (without its newline) and checks
// its version, type and the fields and limits of that type. It never panics
// on any input; FuzzDecode holds it to that.
func decodeMessage(line []byte) (*message, error) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, errorf(codeBadRequest, "malformed message: %v", err)
	}
	if m.V != Version {
		return nil, errorf(codeVersion, "protocol version %d, want %d: use the same gtrain version on every host", m.V, Version)
	}
	check, ok := checks[m.Type]
	if !ok {
		return nil, errorf(codeBadRequest, "unknown message type %q", clip(m.Type))
	}
	if err := check(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

func checkChallenge(m *message) error {
	if err := checkLen("nonce", m.Nonce, nonceLen); err != nil {
		return err
	}
	return checkLen("mac", m.MAC, macLen)
}

func checkLen(field string, b []byte, want int) error {
	if len(b) != want {
		return errorf(codeBadRequest, "%s of %d bytes, want %d", field, len(b), want)
	}
	return nil
}

func checkID(m *message) error {
	if m.ID == 0 {
		return errorf(codeBadRequest, "%s without an id", m.Type)
	}
	return nil
}

func checkKeyValue(m *message) error {
	if err := checkID(m); err != nil {
		return err
	}
	if err := checkKey("key", m.Key); err != nil {
		return err
	}
	if len(m.Value) > MaxValue || len(m.Old) > MaxValue {
		return errorf(codeTooLarge, "value of %d bytes is over the limit of %d", max(len(m.Value), len(m.Old)), MaxValue)
	}
	return nil
}

func checkBarrier(m *message) error {
	if err := checkID(m); err != nil {
		return err
	}
	if err := checkKey("barrier name", m.Name); err != nil {
		return err
	}
	if m.N < 1 || m.N > MaxBarrier {
		return errorf(codeBadRequest, "barrier of %d clients, want 1 to %d", m.N, MaxBarrier)
	}
	return nil
}

func checkKey(what, key string) error {
	if key == "" {
		return errorf(codeBadRequest, "empty %s", what)
	}
	if len(key) > MaxKey {
		return errorf(codeTooLarge, "%s of %d bytes is over the limit of %d", what, len(key), MaxKey)
	}
	return nil
}

func checkJoin(m *message) error {
	if err := checkID(m); err != nil {
		return err
	}
	if err := checkName(m.Name); err != nil {
		return err
	}
	return checkFacts(m.Facts)
}

// checkName accepts what a hostfile can name: no control characters or
// spaces, so that a name is safe to print in a log line.
func checkName(name string) error {
	if name == "" || len(name) > MaxName {
		return errorf(codeBadRequest, "node name of %d bytes, want 1 to %d", len(name), MaxName)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) || r == unicode.ReplacementChar {
			return errorf(codeBadRequest, "node name %q has a space or control character", clip(name))
		}
	}
	return nil
}

// checkFacts requires a JSON object whose known fields have the right types.
func checkFacts(raw json.RawMessage) error {
	if len(raw) > MaxFacts {
		return errorf(codeTooLarge, "facts of %d bytes are over the limit of %d", len(raw), MaxFacts)
	}
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return errorf(codeBadRequest, "facts must be a JSON object")
	}
	var f Facts
	if err := json.Unmarshal(raw, &f); err != nil {
		return errorf(codeBadRequest, "facts: %v", err)
	}
	if f.MasterPort < 0 || f.MasterPort > 65535 || f.CPUs < 0 {
		return errorf(codeBadRequest, "facts: master_port %d or cpus %d out of range", f.MasterPort, f.CPUs)
	}
	return nil
}

// clip shortens an untrusted string before it goes into an error or a log.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

var errLineTooLong = errors.New("line too long")

// readLine reads one newline-terminated line of at most max bytes (newline
// excluded). Past max it stops with errLineTooLong: the stream is then out of
// step and the connection must end.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max+1 {
			return nil, fmt.Errorf("%w: over %d bytes", errLineTooLong, max)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// encodeMessage returns m as one protocol line, newline included.
func encodeMessage(m *message) ([]byte, error) {
	m.V = Version
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
