package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestNewSecret(t *testing.T) {
	a, b := mustSecret(t), mustSecret(t)
	if len(a) != SecretLen || bytes.Equal(a, b) {
		t.Errorf("NewSecret = %x, %x: want two different %d-byte secrets", a, b, SecretLen)
	}
}

func TestListenRejectsConfig(t *testing.T) {
	secret := mustSecret(t)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"short secret", Config{Secret: []byte("short")}, "secret of 5 bytes is too short"},
		{"node twice", Config{Secret: secret, Nodes: []string{"a", "b", "a"}}, "node a listed twice"},
		{"space in name", Config{Secret: secret, Nodes: []string{"a b"}}, "space or control character"},
		{"empty name", Config{Secret: secret, Nodes: []string{""}}, "node name of 0 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Listen(tt.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Listen succeeded")
			}
			if !strings.HasPrefix(err.Error(), "rendezvous: listen 127.0.0.1:0: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Listen error = %q, want %q in it", err, tt.want)
			}
		})
	}
}

// TestServerRejectsUnauthenticated plays clients that do not authenticate:
// each must get an error message, then a closed connection, and the server
// must log why.
func TestServerRejectsUnauthenticated(t *testing.T) {
	wrong := mustSecret(t)
	tests := []struct {
		name     string
		script   func(e *env, r *rawConn)
		wantCode string
		wantLog  string
	}{
		{"wrong secret", func(e *env, r *rawConn) {
			cn := newNonce()
			r.write(&message{Type: typeHello, Nonce: cn})
			ch := r.read()
			r.write(&message{Type: typeAuth, MAC: proof(wrong, clientLabel, cn, ch.Nonce)})
		}, codeAuth, "wrong proof"},
		{"no auth", func(e *env, r *rawConn) {
			r.writeLine(`{"v":1,"type":"set","id":1,"key":"k","value":"dg=="}`)
		}, codeAuth, "expected hello, got set"},
		{"request after hello", func(e *env, r *rawConn) {
			r.write(&message{Type: typeHello, Nonce: newNonce()})
			r.read()
			r.writeLine(`{"v":1,"type":"get","id":1,"key":"k"}`)
		}, codeAuth, "expected auth, got get"},
		{"garbage", func(e *env, r *rawConn) {
			r.writeLine("\x00\xff{not json")
		}, codeAuth, "malformed message"},
		{"short nonce", func(e *env, r *rawConn) {
			r.write(&message{Type: typeHello, Nonce: []byte("12345678")})
		}, codeAuth, "nonce of 8 bytes, want 32"},
		{"oversized hello", func(e *env, r *rawConn) {
			r.writeLine(strings.Repeat("x", maxHandshakeLine+10))
		}, codeTooLarge, "hello line over"},
		{"other version", func(e *env, r *rawConn) {
			r.writeLine(`{"v":2,"type":"hello"}`)
		}, codeVersion, "protocol version 2, want 1"},
		{"replayed transcript", replayTranscript, codeAuth, "wrong proof"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startTCP(t)
			r := e.raw(t)
			tt.script(e, r)
			m := r.read()
			if m == nil || m.Type != typeError || m.ID != 0 || m.Code != tt.wantCode {
				t.Fatalf("got %+v, want an error message with code %q", m, tt.wantCode)
			}
			if next := r.read(); next != nil {
				t.Errorf("after the error message got %+v, want the connection closed", next)
			}
			if log := e.log.String(); !strings.Contains(log, "refused") || !strings.Contains(log, tt.wantLog) {
				t.Errorf("log = %q, want a refusal mentioning %q", log, tt.wantLog)
			}
		})
	}
}

// replayTranscript records a good handshake and replays its hello and auth
// on a new connection: the server's new nonce must make the old proof fail.
func replayTranscript(e *env, r *rawConn) {
	first := e.raw(r.t)
	cn := newNonce()
	hello := &message{Type: typeHello, Nonce: cn}
	first.write(hello)
	ch := first.read()
	auth := &message{Type: typeAuth, MAC: proof(e.secret, clientLabel, cn, ch.Nonce)}
	first.write(auth)
	if w := first.read(); w == nil || w.Type != typeWelcome {
		r.t.Fatalf("original handshake: got %+v, want welcome", w)
	}
	r.write(hello)
	r.read()
	r.write(auth)
}

func TestDialWrongSecret(t *testing.T) {
	e := startTCP(t)
	_, err := Dial(context.Background(), e.addr, mustSecret(t))
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "does not know this job's secret") {
		t.Fatalf("Dial with another secret: %v, want ErrAuth", err)
	}
	if !strings.HasPrefix(err.Error(), "rendezvous: dial "+e.addr+": ") {
		t.Errorf("error %q does not name the operation and address", err)
	}
	c := e.client(t) // the server is still fine for a client that knows the secret
	if err := c.Set(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestClientRefusesImpostor runs a fake server that does not know the
// secret: the client must refuse it before sending any proof of its own.
func TestClientRefusesImpostor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	after := make(chan string, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			after <- err.Error()
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(nc)
		line, _ := readLine(br, maxHandshakeLine)
		hello, err := decodeMessage(line)
		if err != nil {
			after <- err.Error()
			return
		}
		sn := newNonce()
		writeMessage(nc, &message{Type: typeChallenge, Nonce: sn, MAC: proof([]byte("not the job's secret, guessing"), serverLabel, hello.Nonce, sn)})
		line, err = readLine(br, maxHandshakeLine)
		after <- string(line) + errString(err)
	}()
	_, err = Dial(context.Background(), ln.Addr().String(), mustSecret(t))
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "server failed authentication") {
		t.Fatalf("Dial to an impostor: %v, want ErrAuth", err)
	}
	if got := <-after; got != "EOF" {
		t.Errorf("impostor read %q after its challenge, want EOF (no client proof)", got)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestHandshakeTimeout: a silent client is cut off after the handshake
// timeout and does not stop other clients from authenticating meanwhile.
func TestHandshakeTimeout(t *testing.T) {
	tests := []struct {
		name   string
		script func(r *rawConn)
		want   string
	}{
		{"silent", func(r *rawConn) {}, "no hello within the handshake timeout of 5s"},
		{"silent after hello", func(r *rawConn) {
			r.write(&message{Type: typeHello, Nonce: newNonce()})
			r.read()
		}, "no auth within the handshake timeout of 5s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := startPipe(t)
				start := time.Now()
				r := e.raw(t)
				tt.script(r)
				if err := e.client(t).Set(context.Background(), "k", nil); err != nil {
					t.Fatalf("another client, while one is silent: %v", err)
				}
				m := r.read()
				if m == nil || m.Code != codeAuth || !strings.Contains(m.Error, tt.want) {
					t.Fatalf("got %+v, want an auth error %q", m, tt.want)
				}
				if d := time.Since(start); d != DefaultHandshakeTimeout {
					t.Errorf("cut off after %v, want %v", d, DefaultHandshakeTimeout)
				}
				if !strings.Contains(e.log.String(), tt.want) {
					t.Errorf("log = %q, want %q", e.log, tt.want)
				}
			})
		})
	}
}

func TestDialContextEndsHandshake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newPipeListener()
		defer ln.Close()
		go func() { // a server that accepts and never answers
			nc, err := ln.Accept()
			if err == nil {
				defer nc.Close()
				bufio.NewReader(nc).ReadString('\x00')
			}
		}()
		nc, err := ln.dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = newClient(ctx, nc, "pipe", mustSecret(t))
		if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "rendezvous: dial pipe: handshake: context deadline exceeded" {
			t.Fatalf("newClient against a mute server: %v, want a dial error", err)
		}
	})
}
