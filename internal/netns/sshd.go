package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	sshdPath     = "/usr/sbin/sshd"
	privsepDir   = "/run/sshd" // sshd refuses to start without it
	readyTimeout = 10 * time.Second
)

// inHostScript runs "$@" after naming the UTS namespace "$1". The check
// against "$2" (the test process's own UTS namespace) makes sure a caller
// that replaced Cmd.SysProcAttr cannot rename the machine itself.
const inHostScript = `if [ "$(readlink /proc/self/ns/uts)" != "$2" ]; then printf %s "$1" >/proc/sys/kernel/hostname || exit 126; fi; shift 2; exec "$@"`

// sshd is one running sshd; done is closed once it has exited.
type sshd struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *Cluster) hostKey(i int) string {
	return filepath.Join(c.Dir, fmt.Sprintf("host-%d_ed25519", i))
}
func (c *Cluster) sshdConfig(i int) string {
	return filepath.Join(c.Dir, fmt.Sprintf("sshd-%d.conf", i))
}
func (c *Cluster) sshdLogPath(i int) string {
	return filepath.Join(c.Dir, fmt.Sprintf("sshd-%d.log", i))
}

// keygen writes a new ed25519 key pair at path (and path.pub), replacing any.
func keygen(path, comment string) (pub string, err error) {
	_ = os.Remove(path)
	_ = os.Remove(path + ".pub")
	if _, err := run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path + ".pub")
	return strings.TrimSpace(string(b)), err
}

// writeKeys makes the client key, authorized_keys, one host key per host,
// known_hosts (by IP) and an ssh_config naming the hosts h0, h1, ...
func (c *Cluster) writeKeys() error {
	c.IdentityFile = filepath.Join(c.Dir, "id_ed25519")
	c.KnownHosts = filepath.Join(c.Dir, "known_hosts")
	c.SSHConfig = filepath.Join(c.Dir, "ssh_config")
	pub, err := keygen(c.IdentityFile, "gtrain-netns-client")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "authorized_keys"), []byte(pub+"\n"), 0o600); err != nil {
		return err
	}
	var kh, cfg strings.Builder
	var patterns []string
	for i, h := range c.Hosts {
		hostPub, err := keygen(c.hostKey(i), "gtrain-netns-"+h.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(&kh, "%s %s\n", h.IP, hostPub)
		fmt.Fprintf(&cfg, "Host %s\n  HostName %s\n\n", h.Name, h.IP)
		patterns = append(patterns, h.Name, h.IP)
	}
	fmt.Fprintf(&cfg, "Host %s\n  User %s\n  Port 22\n  IdentityFile %s\n  IdentitiesOnly yes\n"+
		"  UserKnownHostsFile %s\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"+
		"  BatchMode yes\n  ConnectTimeout 5\n", strings.Join(patterns, " "), c.User, c.IdentityFile, c.KnownHosts)
	if err := os.WriteFile(c.KnownHosts, []byte(kh.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(c.SSHConfig, []byte(cfg.String()), 0o644)
}

// writeSSHDConfig writes host i's sshd_config. Nothing is included from
// /etc/ssh, so AcceptEnv is unset: like a server that accepts no variables.
// Its sessions get a TMPDIR of their own in the cluster's directory, as
// separate hosts have separate /tmp, and a test that kills an agent
// leaves nothing in the machine's.
func (c *Cluster) writeSSHDConfig(i int, penalties bool) error {
	tmp := filepath.Join(c.Dir, fmt.Sprintf("tmp-%d", i))
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	usePAM := "no"
	if rootLocked() {
		// With UsePAM no, sshd refuses even key logins to a locked ("!")
		// account; PAM's account check does not look at the lock.
		usePAM = "yes"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by gtrain internal/netns for %s.\n", c.Hosts[i].Name)
	fmt.Fprintf(&b, "ListenAddress %s:22\nHostKey %s\nPidFile %s\nAuthorizedKeysFile %s\n",
		c.Hosts[i].IP, c.hostKey(i), filepath.Join(c.Dir, fmt.Sprintf("sshd-%d.pid", i)),
		filepath.Join(c.Dir, "authorized_keys"))
	fmt.Fprintf(&b, "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"+
		"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM %s\nStrictModes no\n"+
		"MaxStartups 100:30:200\nLogLevel VERBOSE\nPrintMotd no\nX11Forwarding no\n", usePAM)
	fmt.Fprintf(&b, "SetEnv TMPDIR=%s\n", tmp)
	if penalties {
		// OpenSSH >= 9.8 blocks sources with many failed or aborted
		// connections; tests make those on purpose, from one address.
		b.WriteString("PerSourcePenalties no\n")
	}
	return os.WriteFile(c.sshdConfig(i), []byte(b.String()), 0o644)
}

// rootLocked reports whether root's password field starts with "!".
func rootLocked() bool {
	f, err := os.Open("/etc/shadow")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "root:"); ok {
			return strings.HasPrefix(rest, "!")
		}
	}
	return false
}

// writeSSHDConfigs writes every host's config, with PerSourcePenalties off
// if this sshd knows the option, and checks the first with `sshd -t`.
func (c *Cluster) writeSSHDConfigs() error {
	if err := os.MkdirAll(privsepDir, 0o755); err != nil {
		return fmt.Errorf("create sshd privilege separation dir: %w", err)
	}
	penalties := true
	if err := c.writeSSHDConfig(0, true); err != nil {
		return err
	}
	if _, err := run(sshdPath, "-t", "-f", c.sshdConfig(0)); err != nil {
		var ce *CmdError
		if !errors.As(err, &ce) || !strings.Contains(ce.Output, "PerSourcePenalties") {
			return err
		}
		penalties = false // older than OpenSSH 9.8
	}
	for i := range c.Hosts {
		if err := c.writeSSHDConfig(i, penalties); err != nil {
			return err
		}
	}
	return nil
}

// startSSHD starts host i's sshd in its namespace and waits until it sends
// its banner to the root namespace.
func (c *Cluster) startSSHD(i int) error {
	log, err := os.OpenFile(c.sshdLogPath(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own copy
	h := c.Hosts[i]
	cmd := exec.Command("ip", "netns", "exec", h.NS, "/bin/sh", "-c", inHostScript, "sh", h.Name, c.uts,
		sshdPath, "-D", "-e", "-f", c.sshdConfig(i))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = hostSysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start sshd for %s: %w", h.Name, err)
	}
	p := &sshd{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.sshds[i] = p
	return c.waitSSH(i, p)
}

// waitSSH polls host i's port 22 until sshd sends "SSH-2.0-" (the process
// exiting or the deadline passing is an error quoting sshd's log).
func (c *Cluster) waitSSH(i int, p *sshd) error {
	addr := net.JoinHostPort(c.Hosts[i].IP, "22")
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("sshd for %s exited (%v); its log:\n%s", c.Hosts[i].Name, p.cmd.ProcessState, c.SSHDLog(i))
		default:
		}
		if last = probeBanner(addr); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("sshd for %s not answering on %s after %v: %v; its log:\n%s", c.Hosts[i].Name, addr, readyTimeout, last, c.SSHDLog(i))
}

func probeBanner(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if !strings.HasPrefix(line, "SSH-2.0-") {
		return fmt.Errorf("no SSH banner from %s (got %q): %v", addr, line, err)
	}
	_, _ = conn.Write([]byte("SSH-2.0-gtrain-netns-probe\r\n"))
	return nil
}

// stop ends sshd: SIGTERM, then SIGKILL after a grace period. Its
// per-connection children are in their own sessions and survive, as with
// a real sshd restart; cleanup kills them with the namespace.
func (p *sshd) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(3 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}
