package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/enginejob"
)

// TestPerNodeEngineEtcd: the built-in engine per node over etcd. 2 nodes
// on their own network-namespace hosts, one rank each, meet in a real
// etcd on a third host (newEtcdJob) and train the job to its end in
// runs/<rdzv-id>, the job recorded there, with every step's loss that of
// an uninterrupted run of the same job on 2 ranks of this machine.
func TestPerNodeEngineEtcd(t *testing.T) {
	j := newEtcdJob(t)
	dir, refDir := t.TempDir(), t.TempDir()
	job := writePerNodeJob(t, "8", "2")
	code, _, stderr := runGtrain(t, 3*time.Minute, "run", "--nproc-per-node", "2", "--table", "never", "--job", job, "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 8)

	var nodes []*node
	for i := range 2 {
		nodes = append(nodes, startNode(t, j.c, i, testSecret, "run", "--nnodes", "2", "--node-rank", "auto",
			"--rdzv-backend", "etcd", "--rdzv-endpoint", j.srv.Endpoint, "--rdzv-id", "etcd-engine",
			"--local-addr", j.c.Hosts[i].IP, "--nproc-per-node", "1", "--table", "never", "--heartbeat", "1s",
			"--grace-period", "3s", "--join-timeout", "90s", "--job", job, "--chdir", dir))
	}
	for i, n := range nodes {
		if code := n.wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s\netcd:\n%s", i, code, n.err.String(), j.srv.Log())
		}
		if !strings.Contains(n.err.String(), "is node "+strconv.Itoa(i)+" of 2 (2 ranks in all") {
			t.Errorf("node %d's stderr does not say it is node %d of 2:\n%s", i, i, n.err.String())
		}
	}
	run := filepath.Join(dir, "runs", "etcd-engine")
	if _, err := os.Stat(filepath.Join(run, enginejob.JobRecordName)); err != nil {
		t.Errorf("the run directory has no record of its job: %v", err)
	}
	compareLosses(t, runLosses(t, run, 8), want, 8)
}
