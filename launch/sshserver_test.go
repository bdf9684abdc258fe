package launch

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// testSSHServer is an in-process SSH server that runs exec requests with
// /bin/sh, enough of sshd for the transport's fast tests.
type testSSHServer struct {
	addr     string
	port     int
	hostKey  ssh.Signer
	clientID string // path of the authorised client key
	env      []string
	execs    atomic.Int32 // exec requests served
	wg       sync.WaitGroup
}

func newKey(t *testing.T) (ssh.Signer, []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sg, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return sg, pem.EncodeToMemory(block)
}

// startSSHServer listens on loopback. Commands run with env (plus PATH and
// this process's TMPDIR; a later TMPDIR in env wins).
func startSSHServer(t *testing.T, env ...string) *testSSHServer {
	t.Helper()
	hostKey, _ := newKey(t)
	clientKey, clientPEM := newKey(t)
	dir := t.TempDir()
	s := &testSSHServer{hostKey: hostKey, clientID: filepath.Join(dir, "id_ed25519"),
		env: append([]string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + os.TempDir()}, env...)}
	if err := os.WriteFile(s.clientID, clientPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) == string(clientKey.PublicKey().Marshal()) {
			return nil, nil
		}
		return nil, io.EOF
	}}
	cfg.AddHostKey(hostKey)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	s.port = l.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { l.Close(); s.wg.Wait() })
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.serve(c, cfg) }()
		}
	}()
	return s
}

// knownHosts writes a known_hosts file holding key for this server.
func (s *testSSHServer) knownHosts(t *testing.T, key ssh.PublicKey) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "known_hosts")
	line := knownhosts.Line([]string{knownhosts.Normalize(s.addr)}, key)
	if err := os.WriteFile(path, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (s *testSSHServer) serve(c net.Conn, cfg *ssh.ServerConfig) {
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		c.Close()
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "no")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go s.session(ch, creqs)
	}
}

// session serves one session: the first exec request runs, like sshd, with
// the channel as the command's stdin/stdout/stderr.
func (s *testSSHServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		if req.Type != "exec" || len(req.Payload) < 4 {
			_ = req.Reply(false, nil)
			continue
		}
		s.execs.Add(1)
		n := binary.BigEndian.Uint32(req.Payload)
		cmd := exec.Command("/bin/sh", "-c", string(req.Payload[4:4+n]))
		cmd.Env = s.env
		cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
		stdin, _ := cmd.StdinPipe()
		_ = req.Reply(true, nil)
		if err := cmd.Start(); err != nil {
			return
		}
		go func() { _, _ = io.Copy(stdin, ch); stdin.Close() }()
		code := 0
		if err := cmd.Wait(); err != nil {
			code = 255
			if ee, ok := err.(*exec.ExitError); ok {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && !ws.Signaled() {
					code = ws.ExitStatus()
				}
			}
		}
		var status [4]byte
		binary.BigEndian.PutUint32(status[:], uint32(code))
		_, _ = ch.SendRequest("exit-status", false, status[:])
		return
	}
}
