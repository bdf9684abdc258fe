package train

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// stallEnv enables TestCheckpointStall, a measurement rather than a test
// (docs/bench/ckpt_async.sh runs it): its value is the number of runs of
// each mode, interleaved.
const stallEnv = "GTRAIN_BENCH_CKPT_ASYNC"

// stallRun is one measured run: each step's wall time (the step, its
// record and whatever checkpoint follows it) by step number, and the
// snapshot's bytes at the end.
type stallRun struct {
	step     map[int]time.Duration
	snapshot int64
}

// stallSpec is the gpt2 preset on one rank with a short sequence, so that
// a step takes about as long as a checkpoint write: a checkpoint every 4
// steps (4, 8, 12) and the final one at step 13.
func stallSpec(dir string, async bool) Spec {
	s := DefaultSpec()
	s.Model = ModelSpec{Preset: "gpt2"}
	s.Batch = BatchSpec{MicroBatch: 1, Seq: 64, GradAccum: 1}
	s.Data.Synthetic = 100_000
	s.Steps, s.Eval, s.LogEvery = 13, EvalSpec{}, 0
	s.Checkpoint = CkptSpec{Dir: dir, Every: 4, Keep: 1, Async: async}
	return s
}

// TestCheckpointStall measures how long a checkpoint stalls training,
// synchronous against asynchronous, for the gpt2 preset: per mode the
// median time of a step that saves minus the median of the synchronous
// run's steps that do not (the stall), and the time the steps after an
// asynchronous save lose to the write still going on beside them (CPU and
// memory bandwidth shared with the writer). GTRAIN_BENCH_DIR puts the
// checkpoints on another filesystem than the test's temporary directory.
func TestCheckpointStall(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv(stallEnv))
	if runs < 1 {
		t.Skip("a measurement: set " + stallEnv + "=RUNS (docs/bench/ckpt_async.sh)")
	}
	var syncRuns, asyncRuns []stallRun
	for range runs {
		syncRuns = append(syncRuns, measureStall(t, false))
		asyncRuns = append(asyncRuns, measureStall(t, true))
	}
	normal := median(stepsWhere(syncRuns, func(s int) bool { return s%4 != 0 && s > 1 && s < 13 }))
	saves := func(rs []stallRun) time.Duration {
		return median(stepsWhere(rs, func(s int) bool { return s%4 == 0 && s < 13 }))
	}
	during := median(stepsWhere(asyncRuns, func(s int) bool { return s%4 != 0 && s > 4 && s < 13 }))
	fmt.Printf("| mode | step that saves | stall (minus a step without: %.2f s) | later steps, each | snapshot per rank |\n", normal.Seconds())
	fmt.Println("|---|---|---|---|---|")
	fmt.Printf("| synchronous | %.2f s | %.2f s | %.2f s | – |\n", saves(syncRuns).Seconds(), (saves(syncRuns) - normal).Seconds(), normal.Seconds())
	fmt.Printf("| checkpoint.async | %.2f s | %.2f s | %.2f s (+%.2f s while the write runs) | %s |\n",
		saves(asyncRuns).Seconds(), (saves(asyncRuns) - normal).Seconds(), during.Seconds(), (during - normal).Seconds(), humanBytes(float64(asyncRuns[0].snapshot)))
}

// measureStall runs stallSpec once and times its steps.
func measureStall(t *testing.T, async bool) stallRun {
	dir := t.TempDir()
	if d := os.Getenv("GTRAIN_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "ckpt-stall-"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	r := stallRun{step: map[int]time.Duration{}}
	var last time.Time
	setHook(t, &testHookStep, func(tr *Trainer) {
		now := time.Now()
		if !last.IsZero() {
			r.step[tr.step] = now.Sub(last)
		}
		last = now
		r.snapshot = tr.snapshotBytes()
	})
	if _, err := Run(context.Background(), stallSpec(dir, async), Env{World: 1}); err != nil {
		t.Fatal(err)
	}
	return r
}

// stepsWhere is the times of the steps of rs that keep says.
func stepsWhere(rs []stallRun, keep func(step int) bool) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		for s, d := range r.step {
			if keep(s) {
				out = append(out, d)
			}
		}
	}
	return out
}

// median is the middle of ds (0 for none).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
