package rendezvous

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// SecretLen is the length of a secret from NewSecret; MinSecretLen the
// shortest secret Listen and Dial accept.
const (
	SecretLen    = 32
	MinSecretLen = 16
)

// DefaultHandshakeTimeout bounds the authentication of a new connection when
// Config.HandshakeTimeout is zero, and a Dial whose context has no earlier
// deadline.
const DefaultHandshakeTimeout = 5 * time.Second

// Labels separate the two proofs, so that neither side's proof can ever be
// replayed as the other's (a reflection attack), and tie them to this
// protocol and version.
var (
	serverLabel = []byte("gtrain rendezvous v1 server proof\x00")
	clientLabel = []byte("gtrain rendezvous v1 client proof\x00")
)

// NewSecret returns a new random per-job secret of SecretLen bytes.
func NewSecret() ([]byte, error) {
	b := make([]byte, SecretLen)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("rendezvous: new secret: %w", err)
	}
	return b, nil
}

func newNonce() []byte {
	b := make([]byte, nonceLen)
	rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return b
}

// proof is HMAC-SHA256(secret, label || client nonce || server nonce). Both
// nonces have a fixed length, so the concatenation is unambiguous.
func proof(secret, label, clientNonce, serverNonce []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(label)
	h.Write(clientNonce)
	h.Write(serverNonce)
	return h.Sum(nil)
}

func checkSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("secret of %d bytes is too short: want at least %d (use NewSecret)", len(secret), MinSecretLen)
	}
	return nil
}

// authenticate runs the server side of the handshake on a new connection:
// read hello, send challenge (with the server's proof), read auth, check
// the client's proof in constant time, send welcome.
func (c *sconn) authenticate(timeout time.Duration) error {
	c.nc.SetDeadline(time.Now().Add(timeout))
	hello, err := c.readHandshake(typeHello, timeout)
	if err != nil {
		return err
	}
	sn := newNonce()
	challenge := &message{Type: typeChallenge, Nonce: sn, MAC: proof(c.s.cfg.Secret, serverLabel, hello.Nonce, sn)}
	if err := c.send(challenge); err != nil {
		return fmt.Errorf("send challenge: %w", err)
	}
	auth, err := c.readHandshake(typeAuth, timeout)
	if err != nil {
		return err
	}
	if !hmac.Equal(auth.MAC, proof(c.s.cfg.Secret, clientLabel, hello.Nonce, sn)) {
		return errorf(codeAuth, "authentication failed: wrong proof (the client does not know this job's secret)")
	}
	if err := c.send(&message{Type: typeWelcome}); err != nil {
		return fmt.Errorf("send welcome: %w", err)
	}
	return c.nc.SetDeadline(time.Time{})
}

// readHandshake reads the next handshake line and requires type want.
func (c *sconn) readHandshake(want string, timeout time.Duration) (*message, error) {
	line, err := readLine(c.br, maxHandshakeLine)
	if err != nil {
		return nil, handshakeReadError(want, timeout, err)
	}
	m, err := decodeMessage(line)
	var se *ServerError
	if errors.As(err, &se) && se.Code == codeBadRequest {
		return nil, errorf(codeAuth, "authentication failed: %v", err)
	}
	if err != nil {
		return nil, err
	}
	if m.Type != want {
		return nil, errorf(codeAuth, "authentication failed: expected %s, got %s: authenticate first (see rendezvous/PROTOCOL.md)", want, m.Type)
	}
	return m, nil
}

func handshakeReadError(want string, timeout time.Duration, err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errorf(codeAuth, "authentication failed: no %s within the handshake timeout of %v", want, timeout)
	case errors.Is(err, errLineTooLong):
		return errorf(codeTooLarge, "authentication failed: %s line over %d bytes", want, maxHandshakeLine)
	case (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && want == typeAuth:
		return errors.New("connection closed before auth (a client with another secret refuses the server's proof and does this)")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("connection closed before %s", want)
	}
	return fmt.Errorf("read %s: %w", want, err)
}

// clientHandshake runs the client side: send hello, check the server's
// proof before proving anything ourselves (so a server that does not know
// the secret learns nothing new), send auth, wait for welcome.
func clientHandshake(nc net.Conn, br *bufio.Reader, secret []byte) error {
	cn := newNonce()
	if err := writeMessage(nc, &message{Type: typeHello, Nonce: cn}); err != nil {
		return err
	}
	ch, err := readReply(br, typeChallenge)
	if err != nil {
		return err
	}
	if !hmac.Equal(ch.MAC, proof(secret, serverLabel, cn, ch.Nonce)) {
		return fmt.Errorf("server failed authentication: it does not know this job's secret: %w", ErrAuth)
	}
	if err := writeMessage(nc, &message{Type: typeAuth, MAC: proof(secret, clientLabel, cn, ch.Nonce)}); err != nil {
		return err
	}
	_, err = readReply(br, typeWelcome)
	return err
}

// readReply reads one handshake line from the server and requires type
// want; an error message becomes a *ServerError.
func readReply(br *bufio.Reader, want string) (*message, error) {
	line, err := readLine(br, maxHandshakeLine)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", want, err)
	}
	m, err := decodeMessage(line)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", want, err)
	}
	if m.Type == typeError {
		return nil, remoteError(m)
	}
	if m.Type != want {
		return nil, fmt.Errorf("read %s: got %s: %w", want, m.Type, ErrBadRequest)
	}
	return m, nil
}

func writeMessage(w io.Writer, m *message) error {
	b, err := encodeMessage(m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
