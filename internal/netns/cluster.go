package netns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// host returns host i, failing the test if there is none.
func (c *Cluster) host(i int) Host {
	c.t.Helper()
	if i < 0 || i >= len(c.Hosts) {
		c.t.Fatalf("netns: host %d: the cluster has hosts 0 to %d", i, len(c.Hosts)-1)
	}
	return c.Hosts[i]
}

// Hostfile writes a hostfile listing every host by IP with slots=slots and
// returns its path. Each call writes a new file.
func (c *Cluster) Hostfile(slots int) string {
	c.t.Helper()
	var b strings.Builder
	for _, h := range c.Hosts {
		fmt.Fprintf(&b, "%s slots=%d\n", h.IP, slots)
	}
	f, err := os.CreateTemp(c.Dir, "hostfile-*")
	if err == nil {
		_, err = f.WriteString(b.String())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.t.Fatalf("netns: write hostfile: %v", err)
	}
	return f.Name()
}

// Cut takes host i off the network, like a pulled cable: its bridge port
// goes down and packets to and from it are dropped silently, so open
// connections hang (until keepalives notice) and new ones time out.
// Processes on the host keep running.
func (c *Cluster) Cut(i int) {
	c.t.Helper()
	c.host(i)
	if err := c.setPort(i, "down"); err != nil {
		c.t.Fatalf("netns: cut %s: %v", c.Hosts[i].Name, err)
	}
}

// Restore undoes Cut and waits until host i's sshd answers again.
func (c *Cluster) Restore(i int) {
	c.t.Helper()
	c.host(i)
	if err := c.setPort(i, "up"); err != nil {
		c.t.Fatalf("netns: restore %s: %v", c.Hosts[i].Name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.waitSSH(i, c.sshds[i]); err != nil {
		c.t.Fatalf("netns: restore %s: %v", c.Hosts[i].Name, err)
	}
}

// Exec returns a command that runs name with args inside host i: in its
// network namespace and with its hostname. Cmd.Path is ip(8), which
// execs into the command, so Cmd.Process is the command itself. Amend
// Cmd.SysProcAttr rather than replacing it, or the command sees the
// machine's hostname. Cleanup kills whatever still runs on the host.
func (c *Cluster) Exec(ctx context.Context, i int, name string, args ...string) *exec.Cmd {
	c.t.Helper()
	h := c.host(i)
	argv := append([]string{"netns", "exec", h.NS, "/bin/sh", "-c", inHostScript, "sh", h.Name, c.uts, name}, args...)
	cmd := exec.CommandContext(ctx, "ip", argv...)
	cmd.SysProcAttr = hostSysProcAttr()
	return cmd
}

// RotateHostKey gives host i a new host key and restarts its sshd, so that
// KnownHosts (which keeps the old key) no longer matches it. Sessions open
// on the host survive, as with a real sshd restart.
func (c *Cluster) RotateHostKey(i int) {
	c.t.Helper()
	h := c.host(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sshds[i].stop()
	if _, err := keygen(c.hostKey(i), "gtrain-netns-"+h.Name+"-rotated"); err != nil {
		c.t.Fatalf("netns: rotate host key of %s: %v", h.Name, err)
	}
	if err := c.startSSHD(i); err != nil {
		c.t.Fatalf("netns: rotate host key of %s: %v", h.Name, err)
	}
}

// SSHDLog returns host i's sshd log (stderr at LogLevel VERBOSE, across
// restarts), for failure messages.
func (c *Cluster) SSHDLog(i int) string {
	b, err := os.ReadFile(c.sshdLogPath(i))
	if err != nil {
		return fmt.Sprintf("(no sshd log: %v)", err)
	}
	return string(b)
}
