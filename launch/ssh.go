package launch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/kevinburke/ssh_config"
	"golang.org/x/crypto/ssh"

	"github.com/gtrain/gtrain/launch/proto"
)

// SSHConfig holds the user's SSH settings for a job.
type SSHConfig struct {
	User           string        // login user when neither hostfile nor ~/.ssh/config names one
	Identities     []string      // identity files (-i), tried before ~/.ssh/config's and the defaults
	KnownHosts     []string      // known_hosts files (default ~/.ssh/known_hosts)
	AcceptNew      bool          // trust an unknown host key on first use and remember it
	ConfigFile     string        // ssh_config file (default ~/.ssh/config; "none" to ignore)
	ConnectTimeout time.Duration // TCP connect + SSH handshake (default 10s)
	KeepAlive      time.Duration // keepalive interval (default 15s); 3 missed = dead
	RemoteGtrain   string        // gtrain's path on the hosts; "" = copy this binary to a per-user cache
}

// SSH starts node agents on remote hosts: one SSH connection and one session
// per host, running `gtrain agent` with no PTY; the assignment goes on the
// session's stdin and events come back on its stdout.
type SSH struct {
	Config SSHConfig
	// Warn receives messages for the user (may be nil).
	Warn func(string)

	confOnce sync.Once
	conf     *ssh_config.Config
	khMu     sync.Mutex

	selfOnce sync.Once
	selfPath string
	selfHash string
	selfErr  error

	slots dialSlots // dials in flight (fanout.go)
}

func (s *SSH) warn(msg string) {
	if s.Warn != nil {
		s.Warn(msg)
	}
}

// Start implements Transport.
func (s *SSH) Start(ctx context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	t := s.resolveTarget(ctx, h, h.User, hostPort(h))
	client, err := s.dial(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := s.startAgent(ctx, client, t, asg)
	if err != nil {
		client.Close()
		return nil, err
	}
	return conn, nil
}

// hostPort is the SSH port written in the hostfile, or 0.
func hostPort(h Host) int {
	if _, p, err := net.SplitHostPort(h.Addr); err == nil {
		var n int
		fmt.Sscan(p, &n)
		return n
	}
	return 0
}

// dial connects and authenticates, through a ProxyJump host if configured.
func (s *SSH) dial(ctx context.Context, t sshTarget) (*ssh.Client, error) {
	ctx, release, err := s.dialSlot(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
	timeout := s.Config.ConnectTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var raw net.Conn
	if t.ProxyJump != "" {
		raw, err = s.dialJump(ctx, t)
	} else {
		var d net.Dialer
		raw, err = d.DialContext(ctx, "tcp", t.Addr())
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			err = context.Cause(ctx) // interrupted, not a network error
		}
		return nil, &HostError{Host: t.Alias, Op: "connect to " + t.Addr(), Err: err}
	}
	client, err := s.handshake(ctx, raw, t)
	if err != nil {
		raw.Close()
		return nil, err
	}
	go s.keepAlive(client)
	return client, nil
}

// dialJump opens a connection to t through its ProxyJump host.
func (s *SSH) dialJump(ctx context.Context, t sshTarget) (net.Conn, error) {
	spec := t.ProxyJump
	user, hostport, ok := strings.Cut(spec, "@")
	if !ok {
		user, hostport = "", spec
	}
	host, port := hostport, 0
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host = h
		fmt.Sscan(p, &port)
	}
	jt := s.resolveTarget(ctx, Host{Name: host}, user, port)
	jt.ProxyJump = "" // one hop
	jump, err := s.dial(ctx, jt)
	if err != nil {
		return nil, fmt.Errorf("via ProxyJump %s: %w", spec, err)
	}
	c, err := jump.DialContext(ctx, "tcp", t.Addr())
	if err != nil {
		jump.Close()
		return nil, err
	}
	return &jumpConn{Conn: c, jump: jump}, nil
}

// jumpConn closes the jump host's client with the tunnelled connection.
type jumpConn struct {
	net.Conn
	jump *ssh.Client
}

func (c *jumpConn) Close() error {
	err := c.Conn.Close()
	c.jump.Close()
	return err
}

// handshake runs the SSH handshake on raw within ctx's deadline.
func (s *SSH) handshake(ctx context.Context, raw net.Conn, t sshTarget) (*ssh.Client, error) {
	cb, algos, err := s.hostKeys(ctx, t)
	if err != nil {
		return nil, err
	}
	cfg := &ssh.ClientConfig{
		User: t.User, Auth: s.authMethods(ctx, t), HostKeyCallback: cb, HostKeyAlgorithms: algos,
	}
	if dl, ok := ctx.Deadline(); ok {
		cfg.Timeout = time.Until(dl)
		_ = raw.SetDeadline(dl)
	}
	// The handshake reads under the deadline alone: an interrupt (Ctrl-C)
	// must end it at once, not when --ssh-timeout runs out.
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	c, chans, reqs, err := ssh.NewClientConn(raw, t.Addr(), cfg)
	if !stop() && errors.Is(ctx.Err(), context.Canceled) {
		if err == nil {
			c.Close()
		}
		return nil, &HostError{Host: t.Alias, Op: "ssh handshake with " + t.User + "@" + t.Addr(), Err: context.Cause(ctx)}
	}
	if err != nil {
		var hk *HostKeyError
		if errors.As(err, &hk) {
			return nil, hk
		}
		return nil, &HostError{Host: t.Alias, Op: "ssh handshake with " + t.User + "@" + t.Addr(), Err: err}
	}
	_ = raw.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// keepAlive sends OpenSSH keepalives; after three unanswered ones it closes
// the connection, which ends the agent's event stream.
func (s *SSH) keepAlive(c *ssh.Client) {
	every := s.Config.KeepAlive
	if every <= 0 {
		every = 15 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	missed := 0
	for range t.C {
		res := make(chan error, 1)
		go func() {
			_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
			res <- err
		}()
		select {
		case err := <-res:
			if err != nil {
				return // closed
			}
			missed = 0
		case <-time.After(every):
			if missed++; missed >= 3 {
				c.Close()
				return
			}
		}
	}
}

// HostError is a failure to reach or log in to a host.
type HostError struct {
	Host string
	Op   string
	Err  error
}

func (e *HostError) Error() string {
	return fmt.Sprintf("ssh: %s: %s: %v%s", e.Host, e.Op, e.Err, hostHint(e.Err))
}

func (e *HostError) Unwrap() error { return e.Err }

// hostHint says what to do about the common reasons a host is unreachable.
func hostHint(err error) string {
	var dns *net.DNSError
	msg := err.Error()
	switch {
	case errors.As(err, &dns):
		return " (name not found: check the hostfile or ~/.ssh/config HostName)"
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "i/o timeout"):
		return " (timed out: is the host up and reachable from here?)"
	case strings.Contains(msg, "connection refused"):
		return " (refused: is sshd running on that port?)"
	case strings.Contains(msg, "unable to authenticate"):
		return " (authentication failed: load a key into ssh-agent or pass -i)"
	}
	return ""
}

// run runs a command on the host and returns its stdout.
func run(c *ssh.Client, cmd string, stdin io.Reader) (string, error) {
	sess, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	sess.Stdin = stdin
	var out, errb strings.Builder
	sess.Stdout, sess.Stderr = &out, &errb
	if err := sess.Run(cmd); err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", cmd, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// self returns this executable's path and content hash.
func (s *SSH) self() (string, string, error) {
	s.selfOnce.Do(func() {
		s.selfPath, s.selfErr = os.Executable()
		if s.selfErr != nil {
			return
		}
		f, err := os.Open(s.selfPath)
		if err != nil {
			s.selfErr = err
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			s.selfErr = err
			return
		}
		s.selfHash = hex.EncodeToString(h.Sum(nil))
	})
	return s.selfPath, s.selfHash, s.selfErr
}

// remoteGtrain returns the path of a gtrain binary on the host identical to
// this one: --remote-gtrain if given, else the per-user cache entry for this
// binary's hash, uploaded first if missing (after checking OS and
// architecture match), atomically (temp file, then rename).
func (s *SSH) remoteGtrain(c *ssh.Client, t sshTarget) (string, error) {
	if s.Config.RemoteGtrain != "" {
		return s.Config.RemoteGtrain, nil
	}
	self, hash, err := s.self()
	if err != nil {
		return "", fmt.Errorf("ssh: find gtrain executable: %w", err)
	}
	uname, err := run(c, "uname -sm", nil)
	if err != nil {
		return "", &HostError{Host: t.Alias, Op: "check OS", Err: err}
	}
	if want := unameFor(runtime.GOOS, runtime.GOARCH); strings.TrimSpace(uname) != want {
		return "", &HostError{Host: t.Alias, Op: "copy gtrain", Err: fmt.Errorf("host is %q, this gtrain is built for %q: install a matching gtrain there and pass --remote-gtrain", strings.TrimSpace(uname), want)}
	}
	dir := `"$HOME/` + remoteCacheDir + `"`
	path := cachedGtrain(hash)
	out, err := run(c, "test -x "+path+" && echo present; echo $HOME", nil)
	if err != nil {
		return "", &HostError{Host: t.Alias, Op: "look for gtrain", Err: err}
	}
	lines := strings.Fields(out)
	home := lines[len(lines)-1]
	final := home + "/" + remoteCacheDir + "/" + cachedName(hash)
	if strings.HasPrefix(out, "present") {
		return final, nil
	}
	f, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tmp := path[:len(path)-1] + `.tmp.$$"`
	script := "umask 077 && mkdir -p " + dir + " && cat > " + tmp + " && chmod 755 " + tmp + " && mv -f " + tmp + " " + path
	if _, err := run(c, script, f); err != nil {
		return "", &HostError{Host: t.Alias, Op: "copy gtrain", Err: err}
	}
	return final, nil
}

// remoteCacheDir is where, under the remote user's home, gtrain copies
// itself; each binary is named by its content hash (cachedName).
const remoteCacheDir = ".cache/gtrain"

func cachedName(hash string) string { return "gtrain-" + hash[:16] }

// cachedGtrain is the shell expression (double-quoted, $HOME expanded by the
// remote shell) for this binary's place in the remote cache.
func cachedGtrain(hash string) string {
	return `"$HOME/` + remoteCacheDir + "/" + cachedName(hash) + `"`
}

// unameFor is what `uname -sm` prints on the platform Go calls goos/goarch.
func unameFor(goos, goarch string) string {
	sys := map[string]string{"linux": "Linux", "darwin": "Darwin", "freebsd": "FreeBSD"}[goos]
	m := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}[goarch]
	if goos == "darwin" && goarch == "arm64" {
		m = "arm64"
	}
	return sys + " " + m
}

// startAgent runs `gtrain agent` in one session and sends it the assignment.
func (s *SSH) startAgent(_ context.Context, c *ssh.Client, t sshTarget, asg *proto.Assignment) (AgentConn, error) {
	bin, err := s.remoteGtrain(c, t)
	if err != nil {
		return nil, err
	}
	sess, err := c.NewSession()
	if err != nil {
		return nil, &HostError{Host: t.Alias, Op: "open session", Err: err}
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	tail := &tailBuffer{max: 4096}
	sess.Stderr = tail
	// exec: the agent replaces the login shell, so sshd's end of the session
	// is the agent itself and closing the connection reaches it as EOF.
	if err := sess.Start("exec " + shellQuote(bin) + " agent"); err != nil {
		sess.Close()
		return nil, &HostError{Host: t.Alias, Op: "start gtrain agent", Err: err}
	}
	sc := &sshConn{client: c, sess: sess, stdin: stdin, enc: proto.NewEncoder(stdin), dec: proto.NewDecoder(stdout), tail: tail}
	if err := sc.enc.Encode(asg); err != nil {
		sc.Kill()
		return nil, &HostError{Host: t.Alias, Op: "send the assignment", Err: err}
	}
	return sc, nil
}

// sshConn is an agent running in an SSH session.
type sshConn struct {
	client *ssh.Client
	sess   *ssh.Session
	stdin  io.WriteCloser
	enc    *proto.Encoder
	dec    *proto.Decoder
	tail   *tailBuffer
	once   sync.Once
}

func (c *sshConn) Recv() (proto.Event, error) {
	var ev proto.Event
	err := c.dec.Decode(&ev)
	return ev, err
}

// Send writes a command, giving up after sendTimeout: a host whose network
// is gone must not stall the launcher's event loop.
func (c *sshConn) Send(cmd proto.Command) error {
	cmd.V = proto.Version
	done := make(chan error, 1)
	go func() { done <- c.enc.Encode(cmd) }()
	select {
	case err := <-done:
		return err
	case <-time.After(sendTimeout):
		return errors.New("ssh: send to agent timed out")
	}
}

// sendTimeout bounds one command write to a remote agent.
const sendTimeout = 5 * time.Second

// Kill drops the connection: the remote agent sees its stdin close and tears
// its ranks down (OpenSSH refuses signals to root sessions, so EOF is the one
// signal that always arrives).
func (c *sshConn) Kill() error {
	c.once.Do(func() { c.client.Close() })
	return nil
}

// Close closes the agent's stdin, waits briefly for the session to end, then
// drops the connection.
func (c *sshConn) Close() error {
	c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.sess.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		err = errors.New("ssh: agent session did not end")
	}
	c.Kill()
	var exit *ssh.ExitMissingError
	if errors.As(err, &exit) {
		err = nil
	}
	return err
}

func (c *sshConn) Stderr() string { return c.tail.String() }

// LocalAddr is this machine's end of the connection: the address the host
// reaches the launcher at.
func (c *sshConn) LocalAddr() net.Addr { return c.client.LocalAddr() }

// RemoteAddr is the address the launcher reached the host at.
func (c *sshConn) RemoteAddr() net.Addr { return c.client.RemoteAddr() }
