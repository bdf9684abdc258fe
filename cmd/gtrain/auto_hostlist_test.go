package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// TestRunAutoHostsIgnoresLauncherMemory: --auto with --hosts (a Slurm
// hostlist, no hostfile) plans from what the hosts' agents reported, as
// with --hostfile (TestRunAutoHostfileIgnoresLauncherMemory): a launcher
// in a memory cgroup of 128 MiB, in which no layout of the job fits, runs
// it on 2 hosts that have the memory. It used to refuse the job from its
// own memory before any host was asked.
func TestRunAutoHostsIgnoresLauncherMemory(t *testing.T) {
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
	hosts := c.Hosts[0].IP + "," + c.Hosts[1].IP
	args := append([]string{"run", "--auto", "--hosts", hosts, "--nproc-per-node", "1", "--job", job, "--table", "never"}, sshArgs(c)...)
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
		t.Fatalf("gtrain run --auto --hosts %s in 128 MiB: %v\n%s", hosts, err, stderr.String())
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
