package netns

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
)

// ssh runs the OpenSSH client from the root namespace against host h, with
// strict host key checking and nothing from ~/.ssh; opts go first so that
// they win over the defaults.
func ssh(t *testing.T, c *Cluster, h Host, opts []string, command ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		Require(t) // keeps CI strict
		t.Skip("no ssh client: apt-get install -y openssh-client")
	}
	args := append([]string{"-F", "/dev/null"}, opts...)
	args = append(args, "-i", c.IdentityFile, "-o", "IdentitiesOnly=yes",
		"-o", "UserKnownHostsFile="+c.KnownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
		"-p", strconv.Itoa(h.Port), c.User+"@"+h.IP, "--")
	out, err := exec.CommandContext(t.Context(), "ssh", append(args, command...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestSSHFromLauncher(t *testing.T) {
	t.Parallel()
	c := New(t, 3)
	for i, h := range c.Hosts {
		if h.Name != fmt.Sprintf("h%d", i) || h.Port != 22 || net.ParseIP(h.IP) == nil {
			t.Errorf("host %d = %+v", i, h)
		}
		out, err := ssh(t, c, h, nil, "hostname")
		if err != nil || out != h.Name {
			t.Errorf("ssh %s hostname = %q, %v; want %q\nsshd log:\n%s", h.IP, out, err, h.Name, c.SSHDLog(i))
		}
	}
	out, err := exec.CommandContext(t.Context(), "ssh", "-F", c.SSHConfig, "h2", "hostname").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "h2" {
		t.Errorf("ssh -F %s h2 hostname = %q, %v", c.SSHConfig, out, err)
	}
	b, err := os.ReadFile(c.Hostfile(4))
	want := fmt.Sprintf("%s slots=4\n%s slots=4\n%s slots=4\n", c.Hosts[0].IP, c.Hosts[1].IP, c.Hosts[2].IP)
	if err != nil || string(b) != want {
		t.Errorf("hostfile = %q, %v; want %q", b, err, want)
	}
}

func TestHostsReachEachOtherAndLauncher(t *testing.T) {
	t.Parallel()
	c := New(t, 2)
	out, err := c.Exec(t.Context(), 0, "ssh", "-F", c.SSHConfig, "h1", "hostname").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "h1" {
		t.Errorf("on h0: ssh h1 hostname = %q, %v", out, err)
	}
	// An agent dials back to the launcher's rendezvous server.
	ln, err := net.Listen("tcp", net.JoinHostPort(c.LauncherIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	dial := c.Exec(t.Context(), 1, "bash", "-c", fmt.Sprintf(`echo "$(hostname)" >/dev/tcp/%s/%s`, c.LauncherIP, port))
	if out, err := dial.CombinedOutput(); err != nil {
		t.Fatalf("on h1: dial launcher %s:%s: %v\n%s", c.LauncherIP, port, err, out)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	if line != "h1\n" || conn.RemoteAddr().(*net.TCPAddr).IP.String() != c.Hosts[1].IP {
		t.Errorf("launcher got %q from %v; want \"h1\\n\" from %s", line, conn.RemoteAddr(), c.Hosts[1].IP)
	}
}

func TestCutAndRestore(t *testing.T) {
	t.Parallel()
	c := New(t, 2)
	c.Cut(1)
	start := time.Now()
	if out, err := ssh(t, c, c.Hosts[1], []string{"-o", "ConnectTimeout=2"}, "true"); err == nil {
		t.Errorf("ssh to cut host succeeded: %s", out)
	} else if !strings.Contains(out, "timed out") && !strings.Contains(out, "No route to host") {
		t.Errorf("ssh to cut host: %v: %s; want a timeout", err, out)
	}
	t.Logf("ssh to cut host failed after %v", time.Since(start).Round(time.Millisecond))
	if out, err := ssh(t, c, c.Hosts[0], nil, "hostname"); err != nil || out != "h0" {
		t.Errorf("cutting h1 broke h0: %q, %v", out, err)
	}
	c.Restore(1)
	if out, err := ssh(t, c, c.Hosts[1], nil, "hostname"); err != nil || out != "h1" {
		t.Errorf("after Restore: ssh h1 hostname = %q, %v", out, err)
	}
}

func TestRotateHostKey(t *testing.T) {
	t.Parallel()
	c := New(t, 2)
	c.RotateHostKey(0)
	out, err := ssh(t, c, c.Hosts[0], nil, "true")
	if err == nil || !strings.Contains(out, "REMOTE HOST IDENTIFICATION HAS CHANGED") {
		t.Errorf("ssh after RotateHostKey = %v, %q; want a host key mismatch", err, out)
	}
	if out, err := ssh(t, c, c.Hosts[1], nil, "hostname"); err != nil || out != "h1" {
		t.Errorf("rotating h0 broke h1: %q, %v", out, err)
	}
}

// TestNothingLeftBehind leaves processes running on a host, inside and
// outside sshd, and checks that cleanup removes them and everything else.
func TestNothingLeftBehind(t *testing.T) {
	Require(t)
	var c *Cluster
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c = New(t, 2)
		sleeper := c.Exec(t.Context(), 0, "sleep", "300")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		go sleeper.Wait()
		// A session child outlives its ssh connection, like a stray rank.
		out, err := ssh(t, c, c.Hosts[1], nil, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
		pid, perr := strconv.Atoi(out)
		if err != nil || perr != nil {
			t.Fatalf("start a session child: %q, %v", out, err)
		}
		pids = append(pids, sleeper.Process.Pid, pid)
		for _, p := range c.sshds {
			pids = append(pids, p.cmd.Process.Pid)
		}
	})
	if c == nil {
		t.Fatal("no cluster")
	}
	if left := c.leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	for _, pid := range pids {
		if proctest.Alive(pid) {
			t.Errorf("pid %d still alive", pid)
		}
	}
	if _, err := os.Stat(recordPath(c.id)); !os.IsNotExist(err) {
		t.Errorf("record %s: %v; want it removed", recordPath(c.id), err)
	}
}

// TestHelperProcess is the child of the tests below, not a test.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("GTRAIN_NETNS_HELPER")
	if mode == "" {
		t.Skip("helper for other tests")
	}
	c := New(t, 1)
	fmt.Printf("cluster %s %d\n", c.id, c.sshds[0].cmd.Process.Pid)
	if mode == "panic" {
		panic("test panics with a cluster up")
	}
	time.Sleep(time.Minute) // to be killed
}

// helper starts the test binary as TestHelperProcess in mode and returns
// it with the id and sshd pid of the cluster it made.
func helper(t *testing.T, mode string) (*exec.Cmd, *bufio.Reader, string, int) {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	// The helper's own temporary directories (its cluster's keys and
	// sshd config) go under this test's: a killed helper cannot remove
	// them itself.
	cmd.Env = append(os.Environ(), "GTRAIN_NETNS_HELPER="+mode, "TMPDIR="+t.TempDir())
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	t.Cleanup(func() { pr.Close() })
	cmd.Stdout, cmd.Stderr = pw, pw // the panic goes to stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(pr)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			cmd.Wait()
			t.Fatalf("helper ended before making a cluster: %v", err)
		}
		var id string
		var pid int
		if _, err := fmt.Sscanf(line, "cluster %s %d", &id, &pid); err == nil {
			return cmd, r, id, pid
		}
	}
}

func TestPanicCleansUp(t *testing.T) {
	Require(t)
	cmd, r, id, sshdPid := helper(t, "panic")
	rest, _ := r.ReadString(0)
	if err := cmd.Wait(); err == nil {
		t.Fatal("helper did not fail")
	}
	if !strings.Contains(rest, "test panics") {
		t.Errorf("helper output lacks the panic:\n%s", rest)
	}
	c := &Cluster{id: id}
	if left := c.leftovers(); len(left) > 0 || proctest.Alive(sshdPid) {
		t.Errorf("after a panic: left %v, sshd alive=%v", left, proctest.Alive(sshdPid))
	}
}

func TestCrashedRunIsSwept(t *testing.T) {
	Require(t)
	cmd, _, id, sshdPid := helper(t, "hang")
	_ = cmd.Process.Signal(syscall.SIGKILL) // no cleanup runs
	_ = cmd.Wait()
	c := &Cluster{id: id}
	if left := c.leftovers(); len(left) == 0 {
		t.Fatal("a killed run left nothing behind: cannot test the sweep")
	}
	if err := withLock(sweepStale); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if left := c.leftovers(); len(left) > 0 || proctest.Alive(sshdPid) {
		t.Errorf("after the sweep: left %v, sshd alive=%v", left, proctest.Alive(sshdPid))
	}
	if _, err := os.Stat(recordPath(id)); !os.IsNotExist(err) {
		t.Errorf("record of swept cluster: %v; want it removed", err)
	}
}
