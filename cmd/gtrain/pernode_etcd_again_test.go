package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Per-node jobs over etcd started again with the same --rdzv-id, as a
// scheduler does with its pods: the store still holds the last run's
// rounds. Each job here runs on the netns hosts of one etcdJob, under its
// own id.

// startBoth starts both nodes of job id, their ranks running script with
// OUT=dir.
func (j *etcdJob) startBoth(t *testing.T, id, dir, script string) []*node {
	t.Helper()
	return []*node{j.start(t, 0, testSecret, id, dir, script), j.start(t, 1, testSecret, id, dir, script)}
}

// waitAll waits for every node to exit and checks each exit code is want.
func (j *etcdJob) waitAll(t *testing.T, nodes []*node, want int, when string) {
	t.Helper()
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != want {
			t.Fatalf("node %d %s: exit %d, want %d\n%s\netcd:\n%s", i, when, code, want, n.err.String(), j.srv.Log())
		}
	}
}

// runAgain starts the job's nodes again, in a fresh OUT, and checks that
// they form a new run, attempt 1, whose ranks all run and finish.
func (j *etcdJob) runAgain(t *testing.T, id string) {
	t.Helper()
	dir := t.TempDir()
	nodes := j.startBoth(t, id, dir, rankScript)
	waitRankFiles(t, 2*time.Minute, upFiles(dir)...)
	checkRanksOnHosts(t, j.c, dir)
	goRanks(t, dir)
	j.waitAll(t, nodes, 0, "started again")
	for i, n := range nodes {
		if !strings.Contains(n.err.String(), "(4 ranks in all, attempt 1)") {
			t.Errorf("node %d started again did not run the job's next round (attempt 1):\n%s", i, n.err.String())
		}
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d started again: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
}

// TestPerNodeEtcdStartedAgain: both nodes of a job started again with the
// same commands and --rdzv-id, after
//   - killed: both SIGKILLed mid-run (a rescheduled Kubernetes job): they
//     find the old run still (no beat for the silence limit) and start the
//     next run, which ends well;
//   - failed: the run ended in failure (every rank exited 1): the next run
//     starts and ends well;
//   - finished: the run ended well: the job is done, and each node says so
//     and exits 0 without running a rank (a pod restarted after success
//     must not run the job twice; a new job takes a new --rdzv-id).
//
// Before, the nodes waited as spares of the old run's closed round for
// ever, or were refused as an ended job (exit 1 after a failure).
func TestPerNodeEtcdStartedAgain(t *testing.T) {
	j := newEtcdJob(t)
	t.Run("killed", func(t *testing.T) {
		dir := t.TempDir()
		nodes := j.startBoth(t, "again-killed", dir, rankScript)
		waitRankFiles(t, time.Minute, upFiles(dir)...)
		for _, n := range nodes {
			if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		j.waitAll(t, nodes, -1, "killed")
		j.runAgain(t, "again-killed")
	})
	t.Run("failed", func(t *testing.T) {
		j.waitAll(t, j.startBoth(t, "again-failed", t.TempDir(), "exit 1"), 1, "whose ranks fail")
		j.runAgain(t, "again-failed")
	})
	t.Run("finished", func(t *testing.T) {
		dir := t.TempDir()
		nodes := j.startBoth(t, "again-finished", dir, rankScript)
		waitRankFiles(t, time.Minute, upFiles(dir)...)
		goRanks(t, dir)
		j.waitAll(t, nodes, 0, "the first time")
		dir2 := t.TempDir()
		nodes = j.startBoth(t, "again-finished", dir2, rankScript)
		j.waitAll(t, nodes, 0, "started again after the job finished")
		for i, n := range nodes {
			if !strings.Contains(n.err.String(), "the job (--rdzv-id) ended already: it finished") {
				t.Errorf("node %d started again after the job finished does not say so:\n%s", i, n.err.String())
			}
		}
		if ents, err := os.ReadDir(dir2); err != nil || len(ents) != 0 {
			t.Errorf("ranks ran when the finished job was started again: %v %v", ents, err)
		}
	})
}
