package launch

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// silentServer accepts TCP connections on loopback and never answers: a
// dial to it stays in its handshake until the connection is closed.
type silentServer struct {
	ln    net.Listener
	conns chan net.Conn
}

func newSilentServer(t *testing.T) *silentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{ln: ln, conns: make(chan net.Conn, 256)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns <- c
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func (s *silentServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// slotSSH is a transport with direct and jump slots of the given sizes
// that reports on waits every dial that found no slot free.
func slotSSH(t *testing.T, direct, jump int, waits chan<- struct{}) *SSH {
	t.Helper()
	_, pem := newKey(t)
	dir := t.TempDir()
	id, kh := filepath.Join(dir, "id"), filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(id, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kh, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A minute: the dials held at the server must not time out on a
	// loaded machine before the test has counted them.
	s := &SSH{Config: SSHConfig{Identities: []string{id}, KnownHosts: []string{kh}, ConfigFile: "none",
		ConnectTimeout: time.Minute}}
	s.slots.direct, s.slots.jump = make(chan struct{}, direct), make(chan struct{}, jump)
	s.slots.onWait = func() { waits <- struct{}{} }
	return s
}

// TestDialSlots: dials beyond the slots wait for one to be free instead of
// connecting, and a ProxyJump hop takes a jump slot: with hosts dialled all
// at once against a server that never answers, exactly as many
// connections arrive as there are slots, and every other dial waits.
func TestDialSlots(t *testing.T) {
	for _, tt := range []struct {
		name            string
		hosts           int
		direct, jump    int
		viaJump         bool
		wantConns, wait int
	}{
		{"direct", 12, 3, 8, false, 3, 9},
		// Behind a bastion all dials first log in to it: the jump slots
		// bound them, whatever the direct slots allow.
		{"jump bound", 12, 64, 2, true, 2, 10},
		// Every direct slot held by a dial whose hop waits: the hops must
		// not need a direct slot too, or none would ever connect.
		{"jump within direct", 4, 2, 8, true, 2, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newSilentServer(t)
			waits := make(chan struct{}, 64)
			s := slotSSH(t, tt.direct, tt.jump, waits)
			done := make(chan error, tt.hosts)
			for i := range tt.hosts {
				tg := sshTarget{Alias: "h" + strconv.Itoa(i), HostName: "127.0.0.1", Port: srv.port(), User: "u"}
				if tt.viaJump {
					// The hosts themselves are never reached: the jump
					// host does not answer.
					tg.Port, tg.ProxyJump = 1, "127.0.0.1:"+strconv.Itoa(srv.port())
				}
				go func() {
					_, err := s.dial(t.Context(), tg)
					done <- err
				}()
			}
			held := countDials(t, srv, waits, done, tt.wantConns, tt.wait)
			// Let every dial end: no server, no connection.
			srv.ln.Close()
			for _, c := range held {
				c.Close()
			}
			for range tt.hosts {
				var he *HostError
				if err := <-done; !errors.As(err, &he) || !strings.HasPrefix(he.Host, "h") {
					t.Errorf("dial error = %v, want a *HostError naming the host", err)
				}
			}
		})
	}
}

// countDials waits until the server holds wantConns connections and wait
// dials have waited for a slot, failing at once on one connection or one
// wait more, or on a dial that ends.
func countDials(t *testing.T, srv *silentServer, waits <-chan struct{}, done <-chan error, wantConns, wait int) []net.Conn {
	t.Helper()
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	w := 0
	backstop := time.After(time.Minute)
	for len(held) != wantConns || w != wait {
		select {
		case c := <-srv.conns:
			if held = append(held, c); len(held) > wantConns {
				t.Fatalf("%d connections in flight at once, want at most %d (%d dials waited)", len(held), wantConns, w)
			}
		case <-waits:
			if w++; w > wait {
				t.Fatalf("%d dials waited for a slot, want %d (%d connections in flight)", w, wait, len(held))
			}
		case err := <-done:
			t.Fatalf("a dial ended while the server held its connection: %v", err)
		case <-backstop:
			t.Fatalf("after a minute: %d connections in flight (want %d), %d dials waiting (want %d)", len(held), wantConns, w, wait)
		}
	}
	return held
}

// TestDialSlotCancelled: a dial that is still waiting for a slot when its
// context ends fails naming the host, and takes no slot.
func TestDialSlotCancelled(t *testing.T) {
	s := slotSSH(t, 1, 1, make(chan struct{}, 1))
	s.slots.direct <- struct{}{} // the one slot, taken
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err := s.dialSlot(ctx, sshTarget{Alias: "worker-3", HostName: "10.0.0.3", Port: 22})
	var he *HostError
	if !errors.As(err, &he) || he.Host != "worker-3" || !errors.Is(err, context.Canceled) {
		t.Fatalf("dialSlot = %v, want a *HostError for worker-3 wrapping context.Canceled", err)
	}
	if n := len(s.slots.direct); n != 1 {
		t.Errorf("%d slots taken after a cancelled wait, want 1", n)
	}
}
