package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A per-node job of the built-in engine that its scheduler starts again
// on another number of nodes keeps the global batch its checkpoint was
// trained with, as an elastic restart within one run does.

// worldNode starts node i of a per-node job of nnodes nodes on this
// machine (127.0.0.1+i, one rank each); the first to bind endpoint hosts
// the rendezvous.
func worldNode(t *testing.T, endpoint, id string, nnodes, i int, extra ...string) *node {
	args := []string{"run", "--nnodes", strconv.Itoa(nnodes), "--rdzv-endpoint", endpoint, "--rdzv-id", id,
		"--local-addr", "127.0.0." + strconv.Itoa(i+1), "--nproc-per-node", "1", "--table", "never",
		"--heartbeat", "500ms", "--grace-period", "3s", "--join-timeout", "90s"}
	return startNode(t, nil, i, testSecret, append(args, extra...)...)
}

// TestPerNodeEngineResumedOnOtherWorld: 2 nodes of one rank train a
// job with parallel.dp 0 and micro_batch 3 (a global batch of 6
// sequences) until a checkpoint is written; then every process of both
// dies at once (a scheduler's restart), and the same job started again on
// another number of nodes trains on with the global batch of 6, saying
// so: on one node with micro_batch 6, on three with micro_batch 2, every
// step's loss that of an uninterrupted run of one rank with micro_batch 6
// within the elastic tests' band (without the fix, 3 and 9 sequences). On
// four nodes, whose 4 replicas do not divide 6 sequences, every node
// refuses as an elastic restart there does, and the run is left as it was.
func TestPerNodeEngineResumedOnOtherWorld(t *testing.T) {
	refDir := t.TempDir()
	// 300 steps: the job is still running when the test kills it, however
	// loaded the machine (killNodes checks that the nodes die by the signal).
	job := writePerNodeJob(t, "300", "2")
	code, _, stderr := runGtrain(t, 4*time.Minute, "run", "--table", "never", "--job", job, "--set", "batch.micro_batch=6", "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 300)
	for _, tc := range []struct {
		nodes int
		micro int // each rank's micro_batch on the new world; 0: refused
	}{{1, 6}, {3, 2}, {4, 0}} {
		t.Run(strconv.Itoa(tc.nodes)+"-nodes", func(t *testing.T) {
			endpoint, dir := freeLoopbackPort(t), t.TempDir()
			common := []string{"--job", job, "--set", "batch.micro_batch=3", "--chdir", dir}
			run := killedOnTwo(t, endpoint, dir, common)
			var nodes []*node
			for i := range tc.nodes {
				nodes = append(nodes, worldNode(t, endpoint, "world-job", tc.nodes, i, common...))
			}
			if tc.micro == 0 {
				before := runFiles(t, run)
				for i, n := range nodes {
					if code := n.wait(t, 4*time.Minute); code == 0 {
						t.Errorf("node %d: exit 0, want a refusal\n%s", i, n.err.String())
					}
				}
				if s := nodes[0].err.String(); !strings.Contains(s, "was trained with a global batch of 6 sequences, which the job started again keeps: train: restart on 4 ranks: 4 replicas do not divide the global batch of 6 sequences") {
					t.Errorf("node 0 does not refuse 4 replicas for the global batch of 6:\n%s", s)
				}
				if after := runFiles(t, run); after != before {
					t.Errorf("the refused job changed the run directory:\nbefore %s\nafter  %s", before, after)
				}
				return
			}
			for i, n := range nodes {
				if code := n.wait(t, 4*time.Minute); code != 0 {
					t.Fatalf("node %d of the job started again on %d: exit %d\n%s", i, tc.nodes, code, n.err.String())
				}
				note := fmt.Sprintf("(written by 2 ranks) on %d: the global batch stays 6 sequences, as the run being resumed trained", tc.nodes)
				if s := n.err.String(); !strings.Contains(s, note) {
					t.Errorf("node %d does not say the global batch stays the resumed run's 6 sequences:\n%s", i, s)
				}
			}
			out := nodes[0].out.String()
			layout := fmt.Sprintf(" steps of 192 tokens, dp %d,", tc.nodes)
			if !strings.Contains(out, layout) {
				t.Errorf("rank 0 does not train 6 sequences of 32 tokens a step on dp %d:\n%s", tc.nodes, out)
			}
			if m := resumedAt.FindStringSubmatch(out); m == nil {
				t.Errorf("rank 0 did not say it resumed from a checkpoint:\n%s", out)
			}
			compareLosses(t, runLosses(t, run, 300), want, 300)
		})
	}
}

// killedOnTwo starts the job of TestPerNodeEngineResumedOnOtherWorld on
// two nodes (args: common), kills both once a checkpoint is written, and
// returns its run directory.
func killedOnTwo(t *testing.T, endpoint, dir string, common []string) string {
	t.Helper()
	nodes := []*node{
		worldNode(t, endpoint, "world-job", 2, 0, common...),
		worldNode(t, endpoint, "world-job", 2, 1, common...),
	}
	run := filepath.Join(dir, "runs", "world-job")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	waitFor(t, ctx, checkpointed(run))
	killNodes(t, ctx, nodes)
	if out := nodes[0].out.String(); !strings.Contains(out, " steps of 192 tokens, dp 2,") {
		t.Fatalf("the first run's rank 0 does not train 6 sequences of 32 tokens a step on dp 2:\n%s", out)
	}
	return run
}
