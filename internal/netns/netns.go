// Package netns gives tests a small cluster of real hosts on one Linux
// machine: each host is a network namespace with its own address on a
// shared bridge, running a real OpenSSH sshd that accepts root by key.
//
// It needs root, iproute2 and openssh-server/-client (see README.md);
// Require skips a test where that is missing. Everything New creates is
// removed by t.Cleanup, and what a killed test binary left behind is swept
// by the next New or Available.
package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
)

// Host is one namespace of a Cluster.
type Host struct {
	Name string // "h0", "h1", ...; also its hostname inside (sshd sessions and Exec)
	NS   string // network namespace, for `ip netns exec`
	IP   string // its address on the bridge
	Port int    // sshd's port: 22
}

// Cluster is a set of hosts reachable from the test process by SSH.
type Cluster struct {
	Hosts        []Host
	User         string // "root"
	IdentityFile string // ed25519 private key authorised on every host
	KnownHosts   string // known_hosts with every host's key, by IP
	SSHConfig    string // ssh_config (for ssh -F) naming the hosts h0, h1, ... with the settings above
	LauncherIP   string // the test process's address on the bridge; hosts reach it
	Dir          string // temp dir with keys, configs and sshd logs

	t      testing.TB
	id     string
	subnet netip.Prefix
	uplink string // root-namespace end of the uplink veth
	uts    string // the test process's UTS namespace, e.g. "uts:[4026531838]"
	mu     sync.Mutex
	sshds  []*sshd
}

var availability = sync.OnceValue(probe)

// Available reports why real hosts cannot be made here, or nil if they can.
// The result is computed once per process.
func Available() error { return availability() }

func probe() error {
	switch {
	case !supported || runtime.GOOS != "linux":
		return errors.New("netns: needs Linux network namespaces")
	case os.Geteuid() != 0:
		return errors.New("netns: not root: network namespaces need CAP_SYS_ADMIN (run the tests as root, e.g. sudo -E go test)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("netns: no `ip` in PATH: apt-get install -y iproute2")
	}
	if _, err := os.Stat(sshdPath); err != nil {
		return fmt.Errorf("netns: no %s: apt-get install -y openssh-server", sshdPath)
	}
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		return errors.New("netns: no ssh-keygen in PATH: apt-get install -y openssh-client")
	}
	err := withLock(func() error {
		if err := sweepStale(); err != nil {
			return fmt.Errorf("sweep of stale namespaces: %w", err)
		}
		// Make and delete a namespace with a bridge and a veth: containers
		// often refuse the first, gVisor-like kernels the others.
		ns := namePrefix + newID() + "-probe"
		defer destroy([]string{ns}, nil)
		for _, s := range [][]string{
			{"netns", "add", ns},
			{"-n", ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"},
			{"-n", ns, "link", "add", "name", "br", "type", "bridge"},
		} {
			if _, err := ip(s...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns: cannot create network namespaces here (a container without CAP_SYS_ADMIN/CAP_NET_ADMIN, or a kernel without veth/bridge): %w", err)
	}
	return nil
}

// Require skips the test if Available fails, or fails it when the
// environment promises real hosts: CI=true or GTRAIN_REQUIRE_NETNS=1 (see
// proctest.Missing).
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_NETNS", err)
	}
}

// New creates a cluster of n hosts (1 to 200) with sshd running on each,
// or skips the test as Require does. t.Cleanup removes all of it, also when
// the test fails or panics. Methods of the cluster report failures with
// t.Fatal, so call them from t's goroutine.
func New(t testing.TB, n int) *Cluster {
	t.Helper()
	Require(t)
	if n < 1 || n > maxHosts {
		t.Fatalf("netns.New: %d hosts, want 1 to %d", n, maxHosts)
	}
	start := time.Now()
	c := &Cluster{t: t, User: "root", Dir: t.TempDir(), sshds: make([]*sshd, n)}
	var err error
	if c.uts, err = os.Readlink("/proc/self/ns/uts"); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := withLock(c.reserve); err != nil {
		t.Fatalf("netns: reserve a cluster: %v", err)
	}
	// Registered before anything exists, so a failure below still cleans up;
	// after t.TempDir's, so it runs first, while the logs still exist.
	t.Cleanup(c.cleanup)
	if err := c.buildNetwork(n); err != nil {
		t.Fatalf("netns: build network %s: %v\n(is another tool managing interfaces named %s*? see internal/netns/README.md)", c.subnet, err, namePrefix)
	}
	if err := c.writeKeys(); err != nil {
		t.Fatalf("netns: make SSH keys: %v (is openssh-client installed?)", err)
	}
	if err := c.writeSSHDConfigs(); err != nil {
		t.Fatalf("netns: sshd config: %v", err)
	}
	for i := range n {
		if err := c.startSSHD(i); err != nil {
			t.Fatalf("netns: %v", err)
		}
	}
	t.Logf("netns: cluster %s: %d hosts on %s (launcher %s) ready in %v; files in %s", c.id, n, c.subnet, c.LauncherIP, time.Since(start).Round(time.Millisecond), c.Dir)
	return c
}

// reserve sweeps stale clusters, then picks an unused id and subnet and
// records them. Call with the lock held.
func (c *Cluster) reserve() error {
	if err := sweepStale(); err != nil {
		return fmt.Errorf("sweep of stale namespaces: %w", err)
	}
	recs := readRecords()
	nss, links, err := owned()
	if err != nil {
		return err
	}
	for {
		c.id = newID()
		_, r := recs[c.id]
		if !r && nss[c.id] == nil && links[c.id] == nil {
			break
		}
	}
	if c.subnet, err = chooseSubnet(recs); err != nil {
		return err
	}
	c.uplink = c.nsName("up")
	c.LauncherIP = c.addr(1)
	pid := os.Getpid()
	return writeRecord(c.id, record{PID: pid, Start: procStart(pid), Subnet: c.subnet.String(), Created: time.Now()})
}

// cleanup stops the sshds, removes the namespaces and links, and checks that
// nothing of the cluster is left.
func (c *Cluster) cleanup() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t.Failed() {
		for i := range c.Hosts {
			c.t.Logf("netns: sshd log of %s (%s):\n%s", c.Hosts[i].Name, c.Hosts[i].IP, c.SSHDLog(i))
		}
	}
	for _, p := range c.sshds {
		p.stop()
	}
	err := withLock(func() error {
		nss, links, err := owned()
		if err != nil {
			return err
		}
		if err := destroy(nss[c.id], links[c.id]); err != nil {
			return err
		}
		if left := c.leftovers(); len(left) > 0 {
			return fmt.Errorf("still present after cleanup: %s", strings.Join(left, ", "))
		}
		return os.Remove(recordPath(c.id))
	})
	if err != nil {
		c.t.Errorf("netns: clean up cluster %s: %v (the next netns.New sweeps it once this process has exited)", c.id, err)
	}
}

// leftovers names whatever of the cluster still exists.
func (c *Cluster) leftovers() []string {
	var left []string
	nss, links, err := owned()
	if err != nil {
		return []string{err.Error()}
	}
	left = append(append(left, nss[c.id]...), links[c.id]...)
	for _, p := range c.sshds {
		if p != nil && procStart(p.cmd.Process.Pid) != "" {
			select {
			case <-p.done:
			default:
				left = append(left, fmt.Sprintf("sshd pid %d", p.cmd.Process.Pid))
			}
		}
	}
	return left
}
