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

// stallRun is one measured run, by step number: the time of the step's
// computation (trainStep: forward, backward, optimizer), of what follows
// it on the training thread for checkpoints (checkpointAfter: a
// synchronous save, or the finiteness check and the copy of an
// asynchronous one, and any wait for the write before it), and whether an
// asynchronous write ran when the step began; and the snapshot's bytes at
// the end.
type stallRun struct {
	train, save map[int]time.Duration
	beside      map[int]bool
	snapshot    int64
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
	s.Threads, _ = strconv.Atoi(os.Getenv("GTRAIN_BENCH_THREADS")) // 0: every core
	return s
}

// TestCheckpointStall measures how long a checkpoint stalls training,
// synchronous against asynchronous, for the gpt2 preset: per mode the
// median time the training thread spends on a checkpoint (the stall), and
// how much longer the steps that begin while an asynchronous write runs
// compute (CPU and memory bandwidth shared with the writer) than the
// synchronous runs' median step, summed per checkpoint. GTRAIN_BENCH_DIR puts the
// checkpoints on another filesystem than the test's temporary directory;
// GTRAIN_BENCH_THREADS sets threads (default: every core).
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
	saves := func(s int) bool { return s%4 == 0 && s < 13 }
	normal := median(pick(syncRuns, func(r stallRun) map[int]time.Duration { return r.train }, func(s int) bool { return s > 1 }))
	stall := func(rs []stallRun) time.Duration {
		return median(pick(rs, func(r stallRun) map[int]time.Duration { return r.save }, saves))
	}
	// What the steps beside a write lose, per checkpoint: their time over
	// a synchronous step's, summed, over the checkpoints of the runs.
	var slowed int
	var extra time.Duration
	for _, r := range asyncRuns {
		for s, d := range r.train {
			if r.beside[s] {
				slowed++
				extra += d - normal
			}
		}
	}
	n := 3 * len(asyncRuns) // checkpoints written in the background: steps 4, 8, 12
	per := extra / time.Duration(n)
	fmt.Printf("| mode | stall per checkpoint | steps beside the write, per checkpoint | their extra time | cost per checkpoint | snapshot per rank |\n")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	fmt.Printf("| synchronous | %.2f s | – | – | %.2f s | – |\n", stall(syncRuns).Seconds(), stall(syncRuns).Seconds())
	fmt.Printf("| checkpoint.async | %.2f s | %.1f | %.2f s | %.2f s | %s |\n", stall(asyncRuns).Seconds(), float64(slowed)/float64(n),
		per.Seconds(), (stall(asyncRuns) + per).Seconds(), humanBytes(float64(asyncRuns[0].snapshot)))
	fmt.Printf("\nA step without a checkpoint: %.2f s (median of the synchronous runs' steps 2-13).\n", normal.Seconds())
}

// measureStall runs stallSpec once, as Run does, timing each step's
// computation and checkpoint apart.
func measureStall(t *testing.T, async bool) stallRun {
	dir := t.TempDir()
	if d := os.Getenv("GTRAIN_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "ckpt-stall-"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	ctx := context.Background()
	tr, err := NewContext(ctx, stallSpec(dir, async), Env{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.runCtx = ctx
	tr.zero.Bind(ctx)
	var res Result
	release, err := tr.prepareCheckpoints(&res)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	r := stallRun{train: map[int]time.Duration{}, save: map[int]time.Duration{}, beside: map[int]bool{}}
	for tr.step < tr.spec.Steps {
		r.beside[tr.step+1] = tr.async != nil && tr.async.phase == saveWriting
		t0 := time.Now()
		if _, err := tr.trainStep(); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := tr.checkpointAfter(&res, false); err != nil {
			t.Fatal(err)
		}
		r.train[tr.step], r.save[tr.step] = t1.Sub(t0), time.Since(t1)
	}
	r.snapshot = tr.snapshotBytes()
	return r
}

// pick is the times of of(r) at the steps keep says, over rs.
func pick(rs []stallRun, of func(stallRun) map[int]time.Duration, keep func(step int) bool) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		for s, d := range of(r) {
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
