// Package slurmtest runs a real Slurm for tests: Debian's slurm-wlm
// (slurmctld, one slurmd per host) and munge, on the network-namespace
// hosts of internal/netns, with every file in the test's temporary
// directory.
//
// Each host of the netns cluster is a Slurm node named after it (h0, h1,
// ...; the names resolve on every host through /etc/netns/<ns>/hosts,
// which `ip netns exec` mounts over /etc/hosts). h0 also runs slurmctld.
// munged runs in the test's own namespace: its socket is a file, which
// the hosts share. One slurmd per namespace needs no "multiple slurmd"
// build of Slurm: each has its own address and port 6818.
//
// New skips the test where Slurm or munge is not installed (apt-get
// install slurm-wlm munge), or fails it where GTRAIN_REQUIRE_SLURM=1 or
// CI=true (proctest.Missing). t.Cleanup stops every daemon it started,
// also when the test fails, and the netns cleanup kills whatever ran on
// the hosts (job steps included).
package slurmtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/internal/proctest"
)

// Cluster is a running Slurm on a netns cluster.
type Cluster struct {
	*netns.Cluster
	Dir  string   // slurm.conf, state, spool and logs
	Conf string   // slurm.conf's path (SLURM_CONF)
	Env  []string // this process's environment with SLURM_CONF: for sbatch, squeue, scancel

	t       testing.TB
	daemons []*daemon
}

// daemon is a process New started; done is closed when it has exited.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Tools are the programs New needs.
var Tools = []string{"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd",
	"sbatch", "srun", "squeue", "scontrol", "scancel"}

// Require skips (or, where promised, fails) t unless Slurm and munge are
// installed.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	for _, tool := range Tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		proctest.Missing(t, "GTRAIN_REQUIRE_SLURM",
			fmt.Errorf("slurmtest: %s not installed: apt-get install -y slurm-wlm munge", strings.Join(missing, ", ")))
	}
}

// New starts munged, slurmctld on host 0 and a slurmd on each of n hosts,
// and waits until every node is idle.
func New(t testing.TB, n int) *Cluster {
	t.Helper()
	Require(t)
	c := &Cluster{Cluster: netns.New(t, n), Dir: t.TempDir(), t: t}
	t.Cleanup(c.stop)
	c.Conf = filepath.Join(c.Dir, "slurm.conf")
	c.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	for _, step := range []func() error{c.writeHosts, c.writeConf, c.startMunge} {
		if err := step(); err != nil {
			t.Fatalf("slurmtest: %v", err)
		}
	}
	c.start("slurmctld", 0, "/usr/sbin/slurmctld", "-D", "-i", "-f", c.Conf)
	for i, h := range c.Hosts {
		c.start("slurmd-"+h.Name, i, "/usr/sbin/slurmd", "-D", "-f", c.Conf, "-N", h.Name)
	}
	if err := c.waitIdle(2 * time.Minute); err != nil {
		t.Fatalf("slurmtest: %v\n%s", err, c.Logs())
	}
	return c
}

// writeHosts gives every host the cluster's names in its /etc/hosts (ip
// netns exec mounts /etc/netns/<ns>/hosts over it); removed at cleanup.
func (c *Cluster) writeHosts() error {
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n")
	for _, h := range c.Hosts {
		fmt.Fprintf(&b, "%s %s\n", h.IP, h.Name)
	}
	for _, h := range c.Hosts {
		dir := filepath.Join("/etc/netns", h.NS)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		c.t.Cleanup(func() {
			os.RemoveAll(dir)
			os.Remove("/etc/netns") // only if no one else's is left
		})
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeConf writes slurm.conf: one partition of every host, root as the
// Slurm user, credentials that expire after 10 s (a requeued job waits
// that long, instead of 121 s, before it may start again, and the
// scheduler looks every 2 s, not 60), no cgroups (proctrack/linuxproc: a step's processes are
// slurmstepd's descendants, so scancel --signal reaches them all, as
// with proctrack/cgroup), no accounting, and the node's declared CPUs
// accepted whatever the namespace's hardware (config_overrides).
func (c *Cluster) writeConf() error {
	d := c.Dir
	dirs := []string{"state"}
	for _, h := range c.Hosts {
		dirs = append(dirs, filepath.Join("spool", h.Name))
	}
	for _, sub := range dirs {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return err
		}
	}
	// ip netns exec mounts a fresh /sys without cgroups, where slurmd's
	// autodetection fails: name the plugin (nothing here uses cgroups).
	if err := os.WriteFile(filepath.Join(d, "cgroup.conf"), []byte("CgroupPlugin=cgroup/v1\n"), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `ClusterName=gtraintest
SlurmctldHost=%s(%s)
AuthType=auth/munge
AuthInfo=socket=%s,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%s
SlurmdSpoolDir=%s
SlurmctldPidFile=%s
SlurmdPidFile=%s
SlurmctldLogFile=%s
SlurmdLogFile=%s
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
JobRequeue=1
`, c.Hosts[0].Name, c.Hosts[0].IP, c.mungeSocket(), filepath.Join(d, "state"), filepath.Join(d, "spool", "%n"),
		filepath.Join(d, "slurmctld.pid"), filepath.Join(d, "slurmd-%n.pid"),
		filepath.Join(d, "slurmctld.log"), filepath.Join(d, "slurmd-%n.log"))
	var names []string
	for _, h := range c.Hosts {
		fmt.Fprintf(&b, "NodeName=%s NodeAddr=%s CPUs=4 RealMemory=1000 State=UNKNOWN\n", h.Name, h.IP)
		names = append(names, h.Name)
	}
	fmt.Fprintf(&b, "PartitionName=test Nodes=%s Default=YES MaxTime=INFINITE State=UP\n", strings.Join(names, ","))
	return os.WriteFile(c.Conf, []byte(b.String()), 0o644)
}

func (c *Cluster) mungeSocket() string { return filepath.Join(c.Dir, "munge", "munge.socket") }

// startMunge writes a key and starts munged on its own socket.
func (c *Cluster) startMunge() error {
	dir := filepath.Join(c.Dir, "munge")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	keyFile := filepath.Join(dir, "munge.key")
	if err := os.WriteFile(keyFile, key, 0o400); err != nil {
		return err
	}
	cmd := exec.Command("/usr/sbin/munged", "--foreground", "--force", "--key-file="+keyFile,
		"--socket="+c.mungeSocket(), "--pid-file="+filepath.Join(dir, "munged.pid"),
		"--log-file="+filepath.Join(c.Dir, "munged.log"), "--seed-file="+filepath.Join(dir, "munged.seed"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.run("munged", cmd); err != nil {
		return err
	}
	return c.waitFile(c.mungeSocket(), 30*time.Second)
}

// start runs a daemon on host i.
func (c *Cluster) start(name string, i int, path string, args ...string) {
	c.t.Helper()
	cmd := c.Exec(context.Background(), i, path, args...)
	cmd.Env = c.Env
	if err := c.run(name, cmd); err != nil {
		c.t.Fatalf("slurmtest: %v", err)
	}
}

// run starts cmd as a daemon, its output in Dir/name.out.
func (c *Cluster) run(name string, cmd *exec.Cmd) error {
	out, err := os.Create(filepath.Join(c.Dir, name+".out"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(d.done) }()
	c.daemons = append(c.daemons, d)
	return nil
}

// stop ends the daemons, newest first: SIGTERM, then SIGKILL after 10 s.
func (c *Cluster) stop() {
	for i := len(c.daemons) - 1; i >= 0; i-- {
		d := c.daemons[i]
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	}
	if c.t.Failed() {
		c.t.Logf("slurmtest logs:\n%s", c.Logs())
	}
}

// waitFile waits for path to exist (a daemon's socket).
func (c *Cluster) waitFile(path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v\n%s", path, limit, c.Logs())
		}
		time.Sleep(50 * time.Millisecond) // polling a daemon's start-up, not synchronising the test
	}
}

// waitIdle waits until sinfo shows every node idle.
func (c *Cluster) waitIdle(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		out, err := c.Command(context.Background(), "sinfo", "--noheader", "--format=%n %t").CombinedOutput()
		last = strings.TrimSpace(string(out))
		if err == nil && c.allIdle(last) {
			return nil
		}
		time.Sleep(200 * time.Millisecond) // polling Slurm's own state
	}
	return fmt.Errorf("nodes not idle within %v: sinfo says %q", limit, last)
}

func (c *Cluster) allIdle(sinfo string) bool {
	lines := strings.Split(sinfo, "\n")
	if len(lines) != len(c.Hosts) {
		return false
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) != 2 || f[1] != "idle" {
			return false
		}
	}
	return true
}

// Command is a Slurm client command (sbatch, squeue, ...) run from the
// test's namespace against the cluster.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env
	return cmd
}

// Logs returns the tails of the daemons' logs.
func (c *Cluster) Logs() string {
	var b strings.Builder
	paths, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	outs, _ := filepath.Glob(filepath.Join(c.Dir, "*.out"))
	for _, p := range append(paths, outs...) {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(p), data)
	}
	return b.String()
}

// JobState returns the job's state as scontrol shows it (PENDING,
// RUNNING, COMPLETED, FAILED, CANCELLED, ...) and its ExitCode field.
func (c *Cluster) JobState(ctx context.Context, id string) (state, exit string, err error) {
	out, err := c.Command(ctx, "scontrol", "show", "job", "--oneliner", id).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("scontrol show job %s: %w: %s", id, err, out)
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "JobState="); ok {
			state = v
		}
		if v, ok := strings.CutPrefix(f, "ExitCode="); ok {
			exit = v
		}
	}
	if state == "" {
		return "", "", errors.New("scontrol show job " + id + ": no JobState")
	}
	return state, exit, nil
}
