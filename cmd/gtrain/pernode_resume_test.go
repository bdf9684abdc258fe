package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/internal/netns"
)

// A per-node job of the built-in engine that its scheduler starts again
// with the same --rdzv-id (a Kubernetes pod restarted, evicted or
// preempted) continues from its newest checkpoint; another job with the
// same id is refused.

// TestPerNodeEngineStartedAgain: 2 network-namespace hosts, one rank
// each. Once a checkpoint is written, both nodes die at once
// (every process of both, launchers, agents and ranks, stopped and then
// SIGKILLed, as a pod's container is killed); the same two commands
// started again finish the job, rank 0 resuming from a checkpoint, with
// every step's loss in metrics.jsonl that of an uninterrupted run. Then
// the same id with another job (another optim.lr) is refused on node 0,
// naming both jobs' digests (node 1 saying why node 0 stopped the job),
// and nothing of the run changes.
func TestPerNodeEngineStartedAgain(t *testing.T) {
	c := netns.New(t, 2)
	dir, refDir := t.TempDir(), t.TempDir()
	// 300 steps: the job is still running when the test kills it, however
	// loaded the machine (checked: the nodes die by the signal).
	job := writePerNodeJob(t, "300", "2")
	code, _, stderr := runGtrain(t, 4*time.Minute, "run", "--nproc-per-node", "2", "--table", "never", "--job", job, "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 300)

	endpoint := c.Hosts[0].IP + ":29400"
	start := func(extra ...string) []*node {
		extra = append([]string{"--nproc-per-node", "1", "--job", job, "--chdir", dir}, extra...)
		return []*node{
			startNode(t, c, 0, testSecret, perNodeArgs(c, endpoint, "again-job", 0, 2, extra)...),
			startNode(t, c, 1, testSecret, perNodeArgs(c, endpoint, "again-job", 1, 2, extra)...),
		}
	}
	run := filepath.Join(dir, "runs", "again-job")
	nodes := start()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	waitFor(t, ctx, checkpointed(run))
	killNodes(t, ctx, nodes)

	nodes = start()
	for i, n := range nodes {
		if code := n.wait(t, 4*time.Minute); code != 0 {
			t.Fatalf("node %d started again: exit %d\n%s", i, code, n.err.String())
		}
	}
	m := resumedAt.FindStringSubmatch(nodes[0].out.String())
	if m == nil {
		t.Fatalf("rank 0 did not say it resumed from a checkpoint:\n%s", nodes[0].out.String())
	}
	if step, _ := strconv.Atoi(m[1]); step < 2 || step >= 300 {
		t.Errorf("rank 0 resumed at step %d, want a step of the killed run, from 2 to 299", step)
	}
	compareLosses(t, runLosses(t, run, 300), want, 300)

	before := runFiles(t, run)
	nodes = start("--set", "optim.lr=0.003")
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code == 0 {
			t.Errorf("node %d of another job with the same id: exit 0, want a refusal\n%s", i, n.err.String())
		}
	}
	var rec struct{ Digest string }
	b, err := os.ReadFile(filepath.Join(run, enginejob.JobRecordName))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.Digest == "" {
		t.Fatalf("%s: %q, %v: want the job's record", enginejob.JobRecordName, b, err)
	}
	s := nodes[0].err.String()
	if !strings.Contains(s, "holds the run of another job with --rdzv-id again-job (job digest "+rec.Digest) || strings.Count(s, "job digest ") < 2 {
		t.Errorf("node 0 does not refuse naming the recorded job's digest %s and its own:\n%s", rec.Digest, s)
	}
	if s := nodes[1].err.String(); !strings.Contains(s, "stopped the job: no plan: run: "+run+" holds the run of another job") {
		t.Errorf("node 1 does not say why node 0 stopped the job:\n%s", s)
	}
	if after := runFiles(t, run); after != before {
		t.Errorf("the refused job changed the run directory:\nbefore %s\nafter  %s", before, after)
	}
}

// killNodes kills every process of the nodes' trees at once, as a pod's
// container dies: all are stopped (SIGSTOP: none can react to another's
// end, an agent by stopping its ranks gracefully), then SIGKILLed. It
// returns once each launcher died by the signal and every process of
// the trees is gone (a zombie holds no lock or port).
func killNodes(t *testing.T, ctx context.Context, nodes []*node) {
	t.Helper()
	var pids []int
	for _, n := range nodes {
		pids = append(pids, n.cmd.Process.Pid)
	}
	pids = append(pids, descendants(t, pids)...)
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		for _, p := range pids {
			if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				t.Fatalf("kill %d: %v", p, err)
			}
		}
	}
	for i, n := range nodes {
		if code := n.wait(t, time.Minute); code != -1 {
			t.Fatalf("node %d exited %d before it was killed: the job ended too soon\n%s", i, code, n.err.String())
		}
	}
	waitFor(t, ctx, func() bool {
		for _, p := range pids {
			if alive(p) {
				return false
			}
		}
		return true
	})
}

// descendants are the processes below roots, read from /proc.
func descendants(t *testing.T, roots []int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := procField(pid, 1); ok {
			parent[pid], _ = strconv.Atoi(pp)
		}
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	var out []int
	for grew := true; grew; {
		grew = false
		for pid, pp := range parent {
			if in[pp] && !in[pid] {
				in[pid], grew = true, true
				out = append(out, pid)
			}
		}
	}
	return out
}

// procField is field i after the command name of /proc/PID/stat (0: the
// state, 1: the parent's PID).
func procField(pid, i int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) <= i {
		return "", false
	}
	return f[i], true
}

// alive says whether pid is a process that has not exited.
func alive(pid int) bool {
	st, ok := procField(pid, 0)
	return ok && st != "Z" && st != "X"
}

// runFiles lists the run directory dir's step directories and the size of
// its metrics file: what a job writing there would change.
func runFiles(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			names = append(names, e.Name()+":"+strconv.FormatInt(fi.Size(), 10)+":"+fi.ModTime().String())
		}
	}
	return strings.Join(names, " ")
}
