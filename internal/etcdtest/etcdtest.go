// Package etcdtest runs a real etcd server for tests (Debian's etcd-server,
// `make deps` installs it): on loopback, with free ports and a temporary
// data directory, stopped and removed when the test ends; or, with
// StartWith, on another address, e.g. inside a network-namespace host.
// Without the binary the test is skipped, or fails where etcd is promised
// (CI=true or GTRAIN_REQUIRE_ETCD=1), as proctest.Missing says.
package etcdtest

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
)

// Require is the variable that makes a missing etcd fail tests.
const Require = "GTRAIN_REQUIRE_ETCD"

// readyTimeout is a backstop: etcd is ready in well under a second on an
// idle machine, in seconds on a loaded one.
const readyTimeout = 60 * time.Second

// Server is one running etcd member.
type Server struct {
	Endpoint string // ADDR:PORT (127.0.0.1 by default), the client URL's host and port
	bin      string
	dir      string
	peer     string
	tls      *TLS
	command  func(name string, args ...string) *exec.Cmd

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *tail
}

// TLS makes etcd serve clients over TLS with this certificate and key, and
// require client certificates signed by CA.
type TLS struct{ Cert, Key, CA string }

// Start runs etcd for t. It skips t (or fails it, see Require) when the
// etcd binary is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartTLS(t, nil)
}

// StartTLS is Start with etcd serving clients over tls (none if nil).
func StartTLS(t testing.TB, tls *TLS) *Server {
	t.Helper()
	return StartWith(t, Options{TLS: tls})
}

// Options says how StartWith runs etcd.
type Options struct {
	TLS *TLS // serve clients over TLS (none if nil)
	// Command, if set, makes the command that runs etcd, e.g. one that runs
	// it inside a netns host (netns.Cluster.Exec). Its SysProcAttr is
	// kept; give it Pdeathsig, as Exec's has. Addr must then be an address
	// of that host: etcd listens on its default ports, 2379 for clients and
	// 2380 for peers, which a host of its own leaves free (this process
	// cannot probe another namespace's ports).
	Command func(name string, args ...string) *exec.Cmd
	Addr    string // where etcd listens; default 127.0.0.1
}

// StartWith runs etcd for t as o says. It skips t (or fails it, see
// Require) when the etcd binary is not installed.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		proctest.Missing(t, Require, fmt.Errorf("no etcd server (apt-get install etcd-server, or make deps): %w", err))
	}
	s := &Server{bin: bin, dir: t.TempDir(), tls: o.TLS, command: o.Command}
	addr := cmp.Or(o.Addr, "127.0.0.1")
	var last error
	for range 3 { // a free port may be taken before etcd binds it: pick again
		s.Endpoint, s.peer = net.JoinHostPort(addr, "2379"), net.JoinHostPort(addr, "2380")
		if o.Command == nil {
			s.Endpoint, s.peer = net.JoinHostPort(addr, freePort(t, addr)), net.JoinHostPort(addr, freePort(t, addr))
		}
		if last = s.start(); last == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("etcdtest: start etcd: %v", last)
	return nil
}

func freePort(t testing.TB, addr string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// start runs etcd on s's ports and data directory and waits until it
// serves clients (its own log line says so: "serving client traffic
// insecurely", or "securely" with TLS).
func (s *Server) start() error {
	peer, client := "http://"+s.peer, "http://"+s.Endpoint
	var tlsArgs []string
	if s.tls != nil {
		client = "https://" + s.Endpoint
		tlsArgs = []string{"--cert-file", s.tls.Cert, "--key-file", s.tls.Key, "--trusted-ca-file", s.tls.CA, "--client-cert-auth"}
	}
	command := s.command
	if command == nil {
		command = exec.Command
	}
	cmd := command(s.bin, append([]string{"--name", "t", "--data-dir", s.dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t=" + peer, "--logger", "zap", "--log-outputs", "stderr"}, tlsArgs...)...)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = sysProcAttr()
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	ready := make(chan struct{})
	log := &tail{}
	done := make(chan struct{})
	go func() {
		log.follow(stderr, "serving client traffic", ready)
		cmd.Wait()
		close(done)
	}()
	select {
	case <-ready:
	case <-done:
		return fmt.Errorf("etcd exited before it was ready:\n%s", log)
	case <-time.After(readyTimeout):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("etcd not ready after %v:\n%s", readyTimeout, log)
	}
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()
	return nil
}

// Stop ends etcd (SIGTERM, as an operator would), keeping its data.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(readyTimeout):
		cmd.Process.Kill()
		<-done
	}
}

// Restart starts etcd again on the same ports and data.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("etcdtest: restart etcd: %v", err)
	}
}

func (s *Server) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		<-done
	}
}

// Log is the last lines etcd wrote.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// tail keeps the last lines of a log.
type tail struct {
	mu    sync.Mutex
	lines []string
}

// follow reads r to its end, keeping the last 40 lines, and closes ready
// at the first line that contains marker.
func (l *tail) follow(r io.Reader, marker string, ready chan struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		if l.lines = append(l.lines, line); len(l.lines) > 40 {
			l.lines = l.lines[1:]
		}
		l.mu.Unlock()
		if ready != nil && strings.Contains(line, marker) {
			close(ready)
			ready = nil
		}
	}
	io.Copy(io.Discard, r) // a line past the buffer: keep etcd from blocking
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// WaitContext is a context for a test step: a generous backstop that only
// a hang reaches.
func WaitContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeoutCause(context.Background(), time.Minute, errors.New("etcdtest: test step did not finish in a minute"))
	t.Cleanup(cancel)
	return ctx
}
