package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// TestResumeOtherHostfileKeepsGlobalBatch: `gtrain resume` of a job that
// ran with parallel.dp 0 on one hostfile (2 hosts × 1 slot, micro_batch
// 3: 6 sequences a step) continues on another (2 hosts × 3 slots) with
// the global batch of 6, not 18: the checkpoint's job names the dp it
// ran, and the ranks reshard (micro_batch 1). Every step's loss is that
// of an uninterrupted run of one rank with micro_batch 6 within the
// elastic tests' band.
func TestResumeOtherHostfileKeepsGlobalBatch(t *testing.T) {
	c := netns.New(t, 2)
	job := writePerNodeJob(t, "8", "2")
	refDir, ckptDir := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	code, _, stderr := runGtrain(t, 3*time.Minute, "run", "--table", "never", "--job", job, "--set", "batch.micro_batch=6", "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 8)

	// The first run fails after step 5 (its checkpoint of step 4 stays).
	first := []string{"--job", job, "--set", "batch.micro_batch=3", "--set", "checkpoint.dir=" + ckptDir,
		"--env", "GTRAIN_FAULT_FAIL_AFTER_STEP=5"}
	code, out, stderr := runGtrain(t, 3*time.Minute, runArgs(c, 1, first)...)
	if code == 0 || !strings.Contains(out, " steps of 192 tokens, dp 2,") {
		t.Fatalf("first run: exit %d, want a failure after step 5 of 6 sequences of 32 tokens a step on dp 2\n%s\n%s", code, out, stderr)
	}

	args := append([]string{"resume", "--hostfile", c.Hostfile(3), "--table", "never"}, sshArgs(c)...)
	code, out, stderr = runGtrain(t, 4*time.Minute, append(args, ckptDir)...)
	if code != 0 {
		t.Fatalf("gtrain resume on 6 ranks: exit %d\n%s\n%s", code, out, stderr)
	}
	if !strings.Contains(out, "resharding: dp 2 → 6, micro_batch 3 → 1 (the global batch stays 6 sequences)") {
		t.Errorf("rank 0 does not reshard to 6 replicas keeping the global batch of 6 sequences:\n%s", out)
	}
	compareLosses(t, runLosses(t, ckptDir, 8), want, 8)
}
