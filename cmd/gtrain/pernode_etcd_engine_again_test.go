package main

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestPerNodeEngineEtcdStartedAgain: TestPerNodeEngineStartedAgain over
// etcd. Both nodes of a built-in engine job die at once (every process
// of both) once a checkpoint is written; started again with
// the same commands they form the job's next run and finish it, rank 0
// resuming from a checkpoint, every step's loss that of an uninterrupted
// run. Before, they waited as spares of the dead run's round.
func TestPerNodeEngineEtcdStartedAgain(t *testing.T) {
	j := newEtcdJob(t)
	dir, refDir := t.TempDir(), t.TempDir()
	job := writePerNodeJob(t, "300", "2") // still running when killed, however loaded the machine
	code, _, stderr := runGtrain(t, 4*time.Minute, "run", "--nproc-per-node", "2", "--table", "never", "--job", job, "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 300)
	start := func() []*node {
		var nodes []*node
		for i := range 2 {
			nodes = append(nodes, startNode(t, j.c, i, testSecret, "run", "--nnodes", "2", "--node-rank", "auto",
				"--rdzv-backend", "etcd", "--rdzv-endpoint", j.srv.Endpoint, "--rdzv-id", "etcd-engine-again",
				"--local-addr", j.c.Hosts[i].IP, "--nproc-per-node", "1", "--table", "never", "--heartbeat", "1s",
				"--grace-period", "3s", "--join-timeout", "90s", "--job", job, "--chdir", dir))
		}
		return nodes
	}
	run := filepath.Join(dir, "runs", "etcd-engine-again")
	nodes := start()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	for {
		// Any checkpoint: the job keeps its newest 3, so step 2's may be
		// gone by the time this looks.
		if ms, _ := filepath.Glob(filepath.Join(run, "step-*", "manifest.json")); len(ms) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint within 3 minutes:\nnode 0:\n%s\nnode 1:\n%s", nodes[0].err.String(), nodes[1].err.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	killNodes(t, ctx, nodes)

	nodes = start()
	for i, n := range nodes {
		if code := n.wait(t, 4*time.Minute); code != 0 {
			t.Fatalf("node %d started again: exit %d\n%s\netcd:\n%s", i, code, n.err.String(), j.srv.Log())
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
}
