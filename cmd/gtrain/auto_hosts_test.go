package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// run --auto on a hostfile's hosts plans from what each host's agent
// reported, over the real-sshd hosts (internal/netns). A host is made
// smaller for real: its sshd, so its agent and ranks, goes into a memory
// cgroup the test makes (auto_cgroup_test.go), whose limit the kernel
// enforces and the agent's detection reads.

// autoHostsJob is a job whose fastest layout is limited by activations: a
// micro-batch of 64 sequences of 128 on each of the 2 ranks, about 350 MiB
// a rank, which a host of 320 MiB cannot hold.
const autoHostsJob = `model: {preset: tiny}
data: {synthetic: 20000}
batch: {micro_batch: 64, seq: 128}
steps: 1
checkpoint: {dir: %s}
eval: {every: 0}
log_every: 1
`

// smallHostLimit is the memory host 1 is given: room for the agent, sshd
// and a rank of the layout planned for it (the planner counts 90% of it
// usable), not for the layout of an unlimited host.
const smallHostLimit = 320 << 20

var (
	// autoFactsLine is the layout planned from the hosts' facts, as the
	// launcher's notice shows it.
	autoFactsLine = regexp.MustCompile(`(?m)^gtrain: from the hosts' reported facts: --auto: (tp=.* recompute=\S+), .*\(predicted ([0-9.]+) ([KMG]iB) of`)
	// reportedLine is what each host reported, as the launcher's notice
	// shows it.
	reportedLine = regexp.MustCompile(`(?m)^gtrain: --auto: the hosts reported (.*)$`)
)

// autoHostsRun runs the job of autoHostsJob with --auto on c's hosts, one
// rank each, and returns its layout (the part of the --auto line that
// names it), the memory the planner predicted for a rank of it, and what
// the hosts reported.
func autoHostsRun(t *testing.T, c *netns.Cluster) (layout string, predicted float64, reported string) {
	t.Helper()
	job := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(job, []byte(fmt.Sprintf(autoHostsJob, t.TempDir())), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--auto", "--hostfile", c.Hostfile(1), "--job", job, "--table", "never"}, sshArgs(c)...)
	code, _, stderr := runGtrain(t, 240*time.Second, args...)
	if code != 0 {
		t.Fatalf("gtrain run --auto: exit %d\n%s", code, stderr)
	}
	m, r := autoFactsLine.FindStringSubmatch(stderr), reportedLine.FindStringSubmatch(stderr)
	if m == nil || r == nil {
		t.Fatalf("no layout planned from the hosts' facts, or no line of what they reported:\n%s", stderr)
	}
	if strings.Contains(stderr, "\ngtrain: --auto: tp=") || strings.HasPrefix(stderr, "gtrain: --auto: tp=") {
		t.Errorf("a layout planned from the launcher's own facts was printed too:\n%s", stderr)
	}
	t.Logf("hosts reported %s; planned %s (predicted %s %s a rank)", r[1], m[1], m[2], m[3])
	n, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		t.Fatal(err)
	}
	return m[1], n * map[string]float64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[3]], r[1]
}

// TestRunAutoHostfilePlansFromAgents: `gtrain run --auto --hostfile` over
// 2 real-sshd hosts lays the job out from what their agents detected.
// Once host 1's sshd (its agent and ranks with it) is in a memory cgroup
// of 320 MiB, host 1 reports that limit, the launcher says so, plans
// every host with it and the layout changes to one that fits it; both
// jobs train to the end, host 1's rank inside the limit.
func TestRunAutoHostfilePlansFromAgents(t *testing.T) {
	cg := newMemCgroup(t, smallHostLimit)
	c := netns.New(t, 2)
	asIs, _, asIsReported := autoHostsRun(t, c)
	if strings.Contains(asIsReported, "cgroup's limit") {
		t.Logf("note: a host reports a cgroup limit before the test set one: %s", asIsReported)
	}

	cg.confine(t, c, 1)
	small, predicted, reported := autoHostsRun(t, c)
	t.Logf("host 1's cgroup: at most %s used", formatSize(cg.peak()))
	want := fmt.Sprintf("%s 320.0 MiB (its cgroup's limit) and", c.Hosts[1].IP)
	if !strings.Contains(reported, want) {
		t.Errorf("hosts reported %q: want host 1 reporting its cgroup's limit, %q", reported, want)
	}
	if strings.Contains(reported, c.Hosts[0].IP+" 320.0 MiB") {
		t.Errorf("hosts reported %q: host 0 is not limited", reported)
	}
	if small == asIs {
		t.Errorf("host 1 limited to 320 MiB got the layout of unlimited hosts: %s", small)
	}
	if usable := 0.9 * smallHostLimit; predicted > usable {
		t.Errorf("planned %s at %s a rank: want at most the %s the planner counts usable of 320 MiB", small, formatSize(int64(predicted)), formatSize(int64(usable)))
	}
}

// TestRunAutoHostfileIgnoresLauncherMemory: with --auto and a hostfile,
// the launcher's own memory decides nothing: a launcher in a memory
// cgroup of 128 MiB, in which no layout of the job fits (its parameters,
// gradients and Adam moments alone are about 290 MiB, 145 MiB a rank on
// 2 ranks), runs the job on 2 hosts that have the memory, planned from
// what they reported. It used to refuse the job from its own memory
// before any host was asked.
func TestRunAutoHostfileIgnoresLauncherMemory(t *testing.T) {
	autoIgnoresLauncherMemory(t, func(c *netns.Cluster) []string { return []string{"--hostfile", c.Hostfile(1)} })
}

// autoIgnoresLauncherMemory runs gtrain run --auto in a memory cgroup of
// 128 MiB, in which no layout of the job fits (its parameters, gradients
// and Adam moments alone are about 290 MiB, 145 MiB a rank on 2 ranks),
// on 2 network-namespace hosts named by the flags hosts gives, and wants
// the layout planned from what those hosts reported.
func autoIgnoresLauncherMemory(t *testing.T, hosts func(c *netns.Cluster) []string) {
	t.Helper()
	cg := newMemCgroup(t, 128<<20)
	c := netns.New(t, 2)
	job := filepath.Join(t.TempDir(), "job.yaml")
	spec := fmt.Sprintf(`model: {preset: tiny, layers: 6, heads: 8, embd: 512, seq: 32}
data: {synthetic: 20000}
batch: {micro_batch: 1, seq: 32}
steps: 1
checkpoint: {dir: %s}
eval: {every: 0}
log_every: 1
`, t.TempDir())
	if err := os.WriteFile(job, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	where := hosts(c)
	args := append(append(append([]string{"run", "--auto"}, where...), "--job", job, "--table", "never"), sshArgs(c)...)
	ctx, cancel := context.WithTimeout(t.Context(), 240*time.Second) // a backstop
	defer cancel()
	// The launcher, not the hosts, in the small cgroup, from its start.
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `echo $$ >"$0" && exec "$@"`, cg.procs(), gtrainBin(t)}, args...)...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	t.Logf("the launcher's cgroup: at most %s used", formatSize(cg.peak()))
	if err != nil {
		t.Fatalf("gtrain run --auto %v in 128 MiB: %v\n%s", where, err, stderr.String())
	}
	out := stderr.String()
	r := reportedLine.FindStringSubmatch(out)
	if r == nil || strings.Contains(r[1], "(its cgroup's limit)") || autoFactsLine.FindString(out) == "" {
		t.Fatalf("want the layout planned from what the unlimited hosts reported:\n%s", out)
	}
	for _, h := range c.Hosts[:2] {
		if !strings.Contains(r[1], h.IP) {
			t.Errorf("the hosts reported %q: want host %s among them", r[1], h.IP)
		}
	}
}
