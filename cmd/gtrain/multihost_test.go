package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/internal/proctest"
)

// The multi-host tier: every "host" is a network namespace with its own IP
// running a real OpenSSH sshd (internal/netns); gtrain reaches them over SSH
// exactly as it would reach other machines. The hosts share this machine's
// file system and PID space, so the tests can read rank output files and
// check by PID that nothing of a job survives.

// sshArgs are the flags that point gtrain at the cluster's keys only.
func sshArgs(c *netns.Cluster) []string {
	return []string{"--identity", c.IdentityFile, "--ssh-known-hosts", c.KnownHosts, "--ssh-config", "none",
		"--heartbeat", "1s", "--grace-period", "3s"}
}

// runArgs builds `gtrain run` arguments for the cluster's hostfile.
func runArgs(c *netns.Cluster, slots int, extra []string, cmd ...string) []string {
	args := append([]string{"run", "--hostfile", c.Hostfile(slots), "--table", "never"}, sshArgs(c)...)
	args = append(args, extra...)
	return append(append(args, "--"), cmd...)
}

// runGtrain runs gtrain to the end and returns its exit code and output.
func runGtrain(t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, gtrainBin(t), args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gtrain %v did not finish within %v\nstderr:\n%s", args, timeout, errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// TestMultiHostEnvContract: 2 hosts × 2 slots over real SSH; each rank
// records its environment and where it ran.
func TestMultiHostEnvContract(t *testing.T) {
	c := netns.New(t, 2)
	dir := t.TempDir()
	script := `{ env; echo HOSTNAME_IS=$(hostname); } > "$OUT/rank.$RANK"`
	code, _, stderr := runGtrain(t, 60*time.Second, runArgs(c, 2, []string{"--env", "OUT=" + dir}, "sh", "-c", script)...)
	if code != 0 {
		t.Fatalf("gtrain exit %d\n%s", code, stderr)
	}
	var port string
	for rank := range 4 {
		env := readEnvFile(t, filepath.Join(dir, "rank."+strconv.Itoa(rank)))
		node := rank / 2
		want := map[string]string{
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(rank % 2), "WORLD_SIZE": "4",
			"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": strconv.Itoa(node), "GROUP_WORLD_SIZE": "2",
			"MASTER_ADDR": c.Hosts[0].IP, "TORCHELASTIC_USE_AGENT_STORE": "False",
			"HOSTNAME_IS": c.Hosts[node].Name, "GTRAIN_HOST": c.Hosts[node].IP, "OUT": dir,
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s = %q, want %q", rank, k, env[k], v)
			}
		}
		if port == "" {
			port = env["MASTER_PORT"]
		}
		if env["MASTER_PORT"] != port || port == "" {
			t.Errorf("rank %d: MASTER_PORT = %q, want the same non-empty port on every rank (%q)", rank, env["MASTER_PORT"], port)
		}
	}
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("rank output: %v", err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// TestMultiHostDDP: PyTorch gloo across 2 hosts × 2 ranks all-reduces
// correctly under gtrain.
func TestMultiHostDDP(t *testing.T) {
	python := proctest.NeedTorch(t)
	c := netns.New(t, 2)
	script, _ := filepath.Abs("../../examples/ddp_allreduce.py")
	// gloo binds the address of the interface it is told, as with real clusters.
	code, out, stderr := runGtrain(t, 180*time.Second,
		runArgs(c, 2, []string{"--env", "GLOO_SOCKET_IFNAME=eth0"}, python, script)...)
	if code != 0 {
		t.Fatalf("gtrain exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	for rank := range 4 {
		if want := "rank " + strconv.Itoa(rank) + "/4: ok"; !strings.Contains(out, want) {
			t.Errorf("no %q in output:\n%s", want, out)
		}
	}
}

// pidsOf reads "pid=N" lines the ranks wrote into dir.
func pidsOf(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	files, _ := filepath.Glob(filepath.Join(dir, "pids.*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(l, "pid="); ok {
				if pid, err := strconv.Atoi(v); err == nil {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// longRank announces its pid and a child's in $OUT/pids.$RANK, then sleeps.
// The file appears whole (renamed into place), so a rank counting the
// files never sees one still empty.
const longRank = `sleep 300 & echo "pid=$! pid=$$" > "$OUT/.pids.$RANK" && mv "$OUT/.pids.$RANK" "$OUT/pids.$RANK"; wait`

// pidsOfN is pidsOf that fails the test unless there are n pids.
func pidsOfN(t *testing.T, dir string, n int) []int {
	t.Helper()
	pids := pidsOf(t, dir)
	if len(pids) != n {
		t.Fatalf("pids announced in %s = %v, want %d", dir, pids, n)
	}
	return pids
}

// TestMultiHostRankFailure: a rank failing on host 1 tears down host 0's
// ranks fast, and gtrain exits with the rank's code, naming host and rank.
func TestMultiHostRankFailure(t *testing.T) {
	c := netns.New(t, 2)
	dir := t.TempDir()
	script := `if [ "$RANK" = 3 ]; then while [ $(ls "$OUT" | wc -l) -lt 3 ]; do sleep 0.05; done; echo "disk full" >&2; exit 5; fi; ` + longRank
	start := time.Now()
	code, _, stderr := runGtrain(t, 60*time.Second, runArgs(c, 2, []string{"--env", "OUT=" + dir}, "sh", "-c", script)...)
	if code != 5 {
		t.Fatalf("gtrain exit %d, want 5\n%s", code, stderr)
	}
	for _, want := range []string{"rank 3", c.Hosts[1].IP, "code 5", "disk full"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("failure report lacks %q:\n%s", want, stderr)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("failure took %v to tear the job down", d)
	}
	awaitGone(t, pidsOfN(t, dir, 6), 10*time.Second) // ranks 0-2, each with its child
}

// startLong starts a long job on the cluster and waits until all its ranks
// (and their children) have announced their pids.
func startLong(t *testing.T, c *netns.Cluster, dir string, extra ...string) (*exec.Cmd, []int, chan error) {
	t.Helper()
	cmd := exec.Command(gtrainBin(t), runArgs(c, 2, append([]string{"--env", "OUT=" + dir}, extra...), "sh", "-c", longRank)...)
	errb := &lockedBuffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pids := pidsOf(t, dir); len(pids) == 8 {
			return cmd, pids, done
		}
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v\n%s", err, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ranks did not start within 60s\n%s", errb.String())
		}
	}
}

// lockedBuffer is a strings.Builder safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMultiHostLauncherKilled: SIGKILL of gtrain leaves no process of the job
// on any host (each agent sees its SSH session close and tears down).
func TestMultiHostLauncherKilled(t *testing.T) {
	c := netns.New(t, 2)
	cmd, pids, done := startLong(t, c, t.TempDir())
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	awaitGone(t, pids, 20*time.Second)
}

// TestMultiHostConcurrentJobs: two jobs on the same hosts; one failing and
// tearing down leaves the other running.
func TestMultiHostConcurrentJobs(t *testing.T) {
	c := netns.New(t, 2)
	a, pidsA, doneA := startLong(t, c, t.TempDir())
	dirB := t.TempDir()
	script := `if [ "$RANK" = 0 ]; then while [ $(ls "$OUT" | wc -l) -lt 3 ]; do sleep 0.05; done; exit 4; fi; ` + longRank
	code, _, stderr := runGtrain(t, 60*time.Second, runArgs(c, 2, []string{"--env", "OUT=" + dirB}, "sh", "-c", script)...)
	if code != 4 {
		t.Fatalf("job B exit %d, want 4\n%s", code, stderr)
	}
	awaitGone(t, pidsOfN(t, dirB, 6), 10*time.Second) // ranks 1-3, each with its child
	for _, pid := range pidsA {
		if !proctest.Alive(pid) {
			t.Errorf("job A's pid %d died with job B", pid)
		}
	}
	_ = a.Process.Signal(syscall.SIGTERM)
	<-doneA
	awaitGone(t, pidsA, 20*time.Second)
}

// TestMultiHostDroppedHost: a host whose network disappears mid-job is
// detected by heartbeat, reported, and the job is torn down everywhere —
// including on the cut-off host, whose agent stops hearing the launcher.
func TestMultiHostDroppedHost(t *testing.T) {
	c := netns.New(t, 2)
	cmd, pids, done := startLong(t, c, t.TempDir())
	c.Cut(1)
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != ExitFailure {
			t.Errorf("gtrain ended with %v, want exit code %d (agent lost)", err, ExitFailure)
		}
		stderr := cmd.Stderr.(*lockedBuffer).String()
		if want := "agent on " + c.Hosts[1].IP + " (node 1) lost"; !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a dropped host was not detected within 60s")
	}
	awaitGone(t, pids, 30*time.Second)
}

// TestMultiHostRefusals: a changed host key and an unreachable host each stop
// the job before any rank starts anywhere, naming the host and the reason.
func TestMultiHostRefusals(t *testing.T) {
	c := netns.New(t, 2)
	tests := []struct {
		name  string
		setup func()
		undo  func()
		want  string
	}{
		{"changed host key", func() { c.RotateHostKey(1) }, func() {}, "CHANGED"},
		{"unreachable host", func() { c.Cut(0) }, func() { c.Restore(0) }, "timed out"},
	}
	for _, tt := range tests {
		tt.setup()
		dir := t.TempDir()
		start := time.Now()
		code, _, stderr := runGtrain(t, 60*time.Second,
			runArgs(c, 1, []string{"--env", "OUT=" + dir, "--ssh-timeout", "3s"}, "sh", "-c", `touch "$OUT/ran.$RANK"`)...)
		tt.undo()
		if code != ExitFailure || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d saying %q", tt.name, code, stderr, ExitFailure, tt.want)
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("%s: took %v to fail, want fast", tt.name, d)
		}
		if ran, _ := filepath.Glob(filepath.Join(dir, "ran.*")); len(ran) > 0 {
			t.Errorf("%s: ranks started although a host was refused: %v", tt.name, ran)
		}
	}
}

// TestMultiHostProxyJump: a host reached only through another, via
// ~/.ssh/config's ProxyJump; its sshd sees the connection come from the jump
// host. The rendezvous address must then be given (--rdzv-host): the jump
// host is not where the launcher listens.
func TestMultiHostProxyJump(t *testing.T) {
	c := netns.New(t, 2)
	conf := filepath.Join(t.TempDir(), "ssh_config")
	body := "Host far\n  HostName " + c.Hosts[1].IP + "\n  ProxyJump root@" + c.Hosts[0].IP + "\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	hostfile := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hostfile, []byte("far slots=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--hostfile", hostfile, "--table", "never"}, sshArgs(c)...)
	args = append(args, "--ssh-config", conf, "--rdzv-host", c.LauncherIP, "--", "sh", "-c", "echo on $(hostname)")
	code, out, stderr := runGtrain(t, 60*time.Second, args...)
	if code != 0 || !strings.Contains(out, "on "+c.Hosts[1].Name) {
		t.Fatalf("exit %d, stdout %q, want the rank on %s\n%s", code, out, c.Hosts[1].Name, stderr)
	}
	if log := c.SSHDLog(1); !strings.Contains(log, "from "+c.Hosts[0].IP) {
		t.Errorf("%s's sshd did not see a connection from the jump host %s:\n%s", c.Hosts[1].Name, c.Hosts[0].IP, log)
	}
}

// TestMultiHostBenchCollectives: `gtrain bench collectives` on 2 hosts × 2
// slots. Its ranks bootstrap through the launcher's rendezvous store and
// link over shared memory within a host and authenticated TCP between the
// hosts; every collective must check clean.
func TestMultiHostBenchCollectives(t *testing.T) {
	c := netns.New(t, 2)
	args := append([]string{"bench", "collectives", "--hostfile", c.Hostfile(2)}, sshArgs(c)...)
	args = append(args, "--collectives", "all", "--min-bytes", "1K", "--max-bytes", "1M", "--step-factor", "32", "--iters", "3", "--output", "json")
	code, stdout, stderr := runGtrain(t, 90*time.Second, args...)
	if code != 0 {
		t.Fatalf("gtrain exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var rep struct {
		WorldSize int      `json:"world_size"`
		Hosts     []string `json:"hosts"`
		Results   []struct {
			Collective string       `json:"collective"`
			SizeBytes  int64        `json:"size_bytes"`
			Out        *benchTiming `json:"out_of_place"`
			In         *benchTiming `json:"in_place"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, stdout)
	}
	if rep.WorldSize != 4 || len(rep.Hosts) != 4 || rep.Hosts[0] != rep.Hosts[1] || rep.Hosts[1] == rep.Hosts[2] {
		t.Fatalf("world %d on hosts %q: want 4 ranks, two per host", rep.WorldSize, rep.Hosts)
	}
	if len(rep.Results) != 6*3 { // 1K, 32K, 1M
		t.Fatalf("%d results, want 18:\n%s", len(rep.Results), stdout)
	}
	for _, r := range rep.Results {
		if r.In == nil && r.Out == nil {
			t.Errorf("%s at %d bytes: no figures", r.Collective, r.SizeBytes)
		}
		for _, v := range []*benchTiming{r.In, r.Out} {
			if v != nil && (v.Wrong != 0 || v.BusBW <= 0) {
				t.Errorf("%s at %d bytes: %d wrong elements, busbw %v", r.Collective, r.SizeBytes, v.Wrong, v.BusBW)
			}
		}
	}
}

type benchTiming struct {
	Wrong int64   `json:"wrong"`
	BusBW float64 `json:"busbw_gbps"`
}
