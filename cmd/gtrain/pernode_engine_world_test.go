package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
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
// sequences) and stop after step 5, past the checkpoint of step 4 (a
// fault injected in its ranks; the job has no restarts, so both nodes
// end); the same job started again by new processes on another number of
// nodes, with none of the rounds' state, trains on with the global batch
// of 6, saying so: on one node with micro_batch 6, on three with
// micro_batch 2, every step's loss that of an uninterrupted run of one
// rank with micro_batch 6 within the elastic tests' band (without the
// fix, 3 and 9 sequences). On four nodes, whose 4 replicas do not divide
// 6 sequences, every node refuses as an elastic restart there does, and
// the run is left as it was. (TestPerNodeEngineStartedAgain kills the
// nodes instead: what the job started again finds is the same.)
func TestPerNodeEngineResumedOnOtherWorld(t *testing.T) {
	refDir := t.TempDir()
	const steps = 12
	job := writePerNodeJob(t, strconv.Itoa(steps), "2")
	code, _, stderr := runGtrain(t, 4*time.Minute, "run", "--table", "never", "--job", job, "--set", "batch.micro_batch=6", "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), steps)
	for _, tc := range []struct {
		nodes int
		micro int // each rank's micro_batch on the new world; 0: refused
	}{{1, 6}, {3, 2}, {4, 0}} {
		t.Run(strconv.Itoa(tc.nodes)+"-nodes", func(t *testing.T) {
			endpoint, dir := freeLoopbackPort(t), t.TempDir()
			common := []string{"--job", job, "--set", "batch.micro_batch=3", "--chdir", dir}
			run := stoppedOnTwo(t, endpoint, dir, common)
			before := runFiles(t, run)
			var nodes []*node
			for i := range tc.nodes {
				nodes = append(nodes, worldNode(t, endpoint, "world-job", tc.nodes, i, common...))
			}
			if tc.micro == 0 {
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
				layout := fmt.Sprintf("runs on %d ranks: tp 1 × pp 1 × dp %d, micro_batch %d × grad_accum 1, the global batch stays 6 sequences", tc.nodes, tc.nodes, tc.micro)
				if s := n.err.String(); !strings.Contains(s, note) || !strings.Contains(s, layout) {
					t.Errorf("node %d does not say the global batch stays the resumed run's 6 sequences, %d on each rank:\n%s", i, tc.micro, s)
				}
			}
			out := nodes[0].out.String()
			layout := fmt.Sprintf(" steps of 192 tokens, dp %d,", tc.nodes)
			if !strings.Contains(out, layout) {
				t.Errorf("rank 0 does not train 6 sequences of 32 tokens a step on dp %d:\n%s", tc.nodes, out)
			}
			if m := resumedAt.FindStringSubmatch(out); m == nil || m[1] != "4" {
				t.Errorf("rank 0 did not say it resumed at step 4 (%v):\n%s", m, out)
			}
			if g, world := trainedGlobal(t, run); g != 6 || world != tc.nodes {
				t.Errorf("the last checkpoint was trained with %d sequences a step on %d ranks, want 6 on %d", g, world, tc.nodes)
			}
			compareLosses(t, runLosses(t, run, steps), want, steps)
		})
	}
}

// stoppedOnTwo runs the job of TestPerNodeEngineResumedOnOtherWorld on
// two nodes (args: common) until its ranks fail after step 5, and returns
// its run directory.
func stoppedOnTwo(t *testing.T, endpoint, dir string, common []string) string {
	t.Helper()
	fault := append(slices.Clone(common), "--env", "GTRAIN_FAULT_FAIL_AFTER_STEP=5")
	nodes := []*node{
		worldNode(t, endpoint, "world-job", 2, 0, fault...),
		worldNode(t, endpoint, "world-job", 2, 1, fault...),
	}
	for i, n := range nodes {
		if code := n.wait(t, 3*time.Minute); code != 1 {
			t.Fatalf("node %d of the first run: exit %d, want 1 (its rank failed after step 5)\n%s", i, code, n.err.String())
		}
	}
	run := filepath.Join(dir, "runs", "world-job")
	if g, world := trainedGlobal(t, run); g != 6 || world != 2 {
		t.Fatalf("the first run's newest checkpoint was trained with %d sequences a step on %d ranks, want 6 on 2", g, world)
	}
	return run
}

// trainedGlobal is the global batch (sequences per step) and the ranks of
// the newest checkpoint in the run directory run, from its manifest.
func trainedGlobal(t *testing.T, run string) (global, world int) {
	t.Helper()
	steps, err := filepath.Glob(filepath.Join(run, "step-*", "manifest.json"))
	if err != nil || len(steps) == 0 {
		t.Fatalf("%s: no checkpoint (%v)", run, err)
	}
	slices.Sort(steps) // step-%08d: in step order
	b, err := os.ReadFile(steps[len(steps)-1])
	if err != nil {
		t.Fatal(err)
	}
	var m ckpt.Manifest
	var spec train.Spec
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", steps[len(steps)-1], err)
	}
	if err := json.Unmarshal(m.Job, &spec); err != nil {
		t.Fatalf("%s: job: %v", steps[len(steps)-1], err)
	}
	return spec.Batch.MicroBatch * spec.Batch.GradAccum * spec.Parallel.DP, m.Layout.World
}
