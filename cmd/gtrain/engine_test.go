package main

import (
	"bufio"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/launch/proto"
)

// engineRun is what a `gtrain run --output json` of the engine reported.
type engineRun struct {
	losses map[int]float32 // step → training loss
	last   int             // highest step reported
	err    error           // from Wait
}

// startEngine runs the real gtrain binary with args in dir; onStatus (when
// not nil) sees each status record's step and the pid of its rank.
func startEngine(t *testing.T, ctx context.Context, dir string, onStatus func(step, pid int), args ...string) func() engineRun {
	t.Helper()
	r := engineRun{losses: map[int]float32{}}
	pid := 0
	wait := startEvents(t, ctx, dir, 1<<20, func(ev proto.Event) {
		switch ev.Type {
		case proto.EventRankStarted:
			pid = ev.PID
		case proto.EventStatus:
			var rec train.Record
			if json.Unmarshal(ev.Status, &rec) == nil {
				r.losses[rec.Step] = rec.Loss
				r.last = max(r.last, rec.Step)
				if onStatus != nil {
					onStatus(rec.Step, pid)
				}
			}
		}
	}, args...)
	return func() engineRun {
		r.err = wait()
		return r
	}
}

// startEvents runs the real gtrain binary with args (--output json among
// them) in dir and hands each event of its stdout (lines up to maxLine
// bytes; others are skipped) to onEvent, in a goroutine of its own; the
// function it returns waits for gtrain to exit, after its last event.
func startEvents(t *testing.T, ctx context.Context, dir string, maxLine int, onEvent func(proto.Event), args ...string) func() error {
	t.Helper()
	cmd := exec.CommandContext(ctx, gtrainBin(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, maxLine)
		for sc.Scan() {
			var ev proto.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				onEvent(ev)
			}
		}
		res <- cmd.Wait()
	}()
	return func() error { return <-res }
}

// TestDefaultJobLossFalls runs `gtrain run` with no command and no job: the
// embedded default job (a tiny GPT on the synthetic corpus) must show a
// clearly falling loss, already by step 60 (about ten seconds on two idle
// cores; the whole job is sized to finish within a minute).
func TestDefaultJobLossFalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	start := time.Now()
	r := startEngine(t, ctx, dir, nil, "run", "--output", "json")()
	if r.err != nil {
		t.Fatalf("gtrain run: %v", r.err)
	}
	t.Logf("default job: %d steps in %v", r.last, time.Since(start).Round(time.Millisecond))
	first, at60, final := r.losses[1], r.losses[60], r.losses[r.last]
	if r.last != train.DefaultSpec().Steps || first < 5 {
		t.Fatalf("ran %d steps, first loss %v: want the default job's %d steps from about ln(257) = 5.55", r.last, first, train.DefaultSpec().Steps)
	}
	if at60 > 2.5 || final > 1.5 {
		t.Errorf("loss %v at step 1, %v at step 60, %v at step %d: want below 2.5 by step 60 and 1.5 at the end", first, at60, final, r.last)
	}
	runs, _ := filepath.Glob(filepath.Join(dir, "runs", "*"))
	if len(runs) != 1 {
		t.Fatalf("checkpoint directories %v, want one under runs/", runs)
	}
	if c, ok := train.NewestValid(t.Context(), runs[0]); !ok || c.Step() != int64(r.last) {
		t.Errorf("newest valid checkpoint in %s: found %v, want step %d", runs[0], ok, r.last)
	}
}

const killJob = `
model: {preset: test}
data: {synthetic: 50000}
batch: {micro_batch: 2, seq: 32}
steps: 150
optim: {warmup_steps: 5}
checkpoint: {dir: ckpt, every: 1, keep: 3}
eval: {every: 0}
threads: 1
`

// TestKillDuringCheckpointThenResume kills the rank with SIGKILL at random
// moments of a job that checkpoints every step (so most kills land in a
// checkpoint write), resumes it each time with `gtrain resume`, and checks
// that the run finishes with exactly the losses of an uninterrupted run.
func TestKillDuringCheckpointThenResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ref, dir := t.TempDir(), t.TempDir()
	for _, d := range []string{ref, dir} {
		if err := os.WriteFile(filepath.Join(d, "job.yaml"), []byte(killJob), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := startEngine(t, ctx, ref, nil, "run", "--output", "json", "--job", "job.yaml")()
	if want.err != nil || want.last != 150 {
		t.Fatalf("uninterrupted run: %v after %d steps", want.err, want.last)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	args := []string{"run", "--output", "json", "--job", "job.yaml"}
	got := map[int]float32{}
	from := 0
	for kill := 0; ; kill++ {
		// Kill a few steps after the first status record of this attempt,
		// so that every attempt has committed at least one checkpoint.
		target, killed := from+3+rng.IntN(25), false
		onStatus := func(step, pid int) {
			if kill < 4 && !killed && step >= target {
				killed = true
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		r := startEngine(t, ctx, dir, onStatus, args...)()
		for s, l := range r.losses {
			got[s] = l
		}
		if !killed {
			if r.err != nil {
				t.Fatalf("attempt %d: %v", kill, r.err)
			}
			break
		}
		if r.err == nil {
			t.Fatalf("attempt %d: the rank was killed at step %d but gtrain exited 0", kill, r.last)
		}
		c, ok := train.NewestValid(t.Context(), filepath.Join(dir, "ckpt"))
		if !ok {
			t.Fatalf("attempt %d: no valid checkpoint left after SIGKILL at step %d", kill, r.last)
		}
		t.Logf("attempt %d: killed at step %d (reported %d); resuming from step %d", kill, target, r.last, c.Step())
		from = int(c.Step())
		args = []string{"resume", "--output", "json", filepath.Join(dir, "ckpt")}
	}
	for s := 1; s <= 150; s++ {
		if got[s] != want.losses[s] {
			t.Errorf("step %d: loss %v after kills and resumes, %v uninterrupted", s, got[s], want.losses[s])
		}
	}
	// metrics.jsonl went through the kills too: each step once, in order,
	// with the uninterrupted losses.
	checkRunMetrics(t, filepath.Join(dir, "ckpt"), want.losses, 150)
}
