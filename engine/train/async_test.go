package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// asyncLayouts are the layouts the asynchronous checkpoint tests run:
// the data-parallel path (ZeRO 1 over two ranks, fp16 on one rank so the
// loss scaler is saved) and tensor and pipeline parallelism (tp2·pp2).
func asyncLayouts() []struct {
	name  string
	ranks int
	spec  func(dir string) Spec
} {
	dp := func(dir string) Spec {
		s := dpSpec(1, 2)
		s.Checkpoint = CkptSpec{Dir: dir, Every: 2}
		return s
	}
	fp16 := func(dir string) Spec {
		s := dpSpec(0, 1)
		s.Precision = "fp16"
		s.Checkpoint = CkptSpec{Dir: dir, Every: 2}
		return s
	}
	grid := func(dir string) Spec {
		s := gridSpec(gridLayout{tp: 2, pp: 2, dp: 1, zero: 1})
		s.Steps, s.Checkpoint = 8, CkptSpec{Dir: dir, Every: 2}
		return s
	}
	return []struct {
		name  string
		ranks int
		spec  func(dir string) Spec
	}{{"dp2-zero1", 2, dp}, {"fp16-one-rank", 1, fp16}, {"tp2-pp2", 4, grid}}
}

// TestAsyncCheckpointsEqualSync: with checkpoint.async every checkpoint
// of a run (steps 2, 4, 6 of 8 in the background, 8 at the end) holds the
// very bytes of the synchronous run's: every rank's file, and so its
// export; the losses are the same, each rank reports the snapshot's
// memory (on the data-parallel path exactly EstimateMemory's), and a run
// resumed from the asynchronous step-4 checkpoint continues with the
// synchronous run's losses.
func TestAsyncCheckpointsEqualSync(t *testing.T) {
	for _, l := range asyncLayouts() {
		t.Run(l.name, func(t *testing.T) {
			syncDir, asyncDir := t.TempDir(), t.TempDir()
			want := runRanks(t, l.spec(syncDir), l.ranks, nil)
			s := l.spec(asyncDir)
			s.Checkpoint.Async = true
			got, recs := runWithStatus(t, s, l.ranks)
			if !slices.Equal(got[0].Losses, want[0].Losses) {
				t.Fatalf("losses with asynchronous checkpoints %v, synchronous %v", got[0].Losses, want[0].Losses)
			}
			if got[0].Checkpoint != filepath.Join(asyncDir, ckpt.StepDirName(8)) {
				t.Errorf("last checkpoint %q, want step 8's", got[0].Checkpoint)
			}
			sameCheckpoints(t, syncDir, asyncDir, l.ranks, []int64{2, 4, 6, 8})
			checkSnapshotMemory(t, s, recs)

			resumed := runRanks(t, s, l.ranks, func(e *Env) { e.ResumeFrom = filepath.Join(asyncDir, ckpt.StepDirName(4)) })
			if resumed[0].Resumed != 4 || !slices.Equal(resumed[0].Losses, want[0].Losses[4:]) {
				t.Errorf("resumed from step %d with losses %v, want step 4 and %v", resumed[0].Resumed, resumed[0].Losses, want[0].Losses[4:])
			}
		})
	}
}

// sameCheckpoints fails unless each step's checkpoint in dir b is valid
// and every rank's file holds the bytes of dir a's.
func sameCheckpoints(t *testing.T, a, b string, ranks int, steps []int64) {
	t.Helper()
	for _, step := range steps {
		ca, err := ckpt.Open(t.Context(), filepath.Join(a, ckpt.StepDirName(step)))
		if err != nil {
			t.Fatal(err)
		}
		cb, err := ckpt.Open(t.Context(), filepath.Join(b, ckpt.StepDirName(step)))
		if err != nil {
			t.Fatalf("asynchronous checkpoint of step %d: %v", step, err)
		}
		if len(cb.Manifest.Files) != ranks {
			t.Fatalf("step %d: %d files, want %d", step, len(cb.Manifest.Files), ranks)
		}
		for r := range ranks {
			fa, errA := os.ReadFile(filepath.Join(ca.Dir, ckpt.RankFileName(r)))
			fb, errB := os.ReadFile(filepath.Join(cb.Dir, ckpt.RankFileName(r)))
			if err := errors.Join(errA, errB); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fa, fb) {
				t.Errorf("step %d, rank %d: the asynchronous file (%d bytes) differs from the synchronous one (%d bytes)", step, r, len(fb), len(fa))
			}
		}
	}
}

// checkSnapshotMemory fails unless every rank's last record reports a
// snapshot, counted in the total; on the data-parallel path it must be
// EstimateMemory's to the byte.
func checkSnapshotMemory(t *testing.T, s Spec, recs []Record) {
	t.Helper()
	rs, err := s.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if rs, err = fitDP(rs, Env{World: len(recs)}); err != nil {
		t.Fatal(err)
	}
	for r, rec := range recs {
		m := rec.Memory
		if m.Snapshot <= 0 || m.Total != m.Params+m.Grads+m.Optimizer+m.Activations+m.Buffers+m.Snapshot {
			t.Errorf("rank %d: memory %+v: want a snapshot, counted in the total", r, m)
		}
		est, err := EstimateMemory(rs, len(recs), r, len(recs))
		if err != nil {
			t.Fatal(err)
		}
		if rs.Parallel.ModelParallel() == 1 && float64(m.Snapshot) != est.Snapshot {
			t.Errorf("rank %d: snapshot %d bytes, estimated %g", r, m.Snapshot, est.Snapshot)
		}
	}
}

// TestAsyncTrainingGoesOnDuringWrite: while every rank's write of the
// step-4 checkpoint is held (a test hook blocks the writing goroutine),
// both ranks train steps 5 and 6, and step 4 is no checkpoint yet; once
// released, it is committed, and the run ends with every checkpoint
// valid. A synchronous save would hold the trainer at step 4 until the
// backstop released the write, which fails the test.
func TestAsyncTrainingGoesOnDuringWrite(t *testing.T) {
	dir := t.TempDir()
	s := dpSpec(1, 2)
	s.Checkpoint = CkptSpec{Dir: dir, Every: 4, Async: true}
	entered, release := make(chan int, 2), make(chan struct{})
	timedOut := make(chan struct{}, 2)
	setHook(t, &testHookAsyncWrite, func(rank, step int) {
		if step != 4 {
			return
		}
		entered <- rank
		select {
		case <-release:
		case <-time.After(backstop):
			timedOut <- struct{}{}
		}
	})
	var reached []int
	setHook(t, &testHookStep, func(tr *Trainer) {
		if tr.env.Rank != 0 || tr.step != 6 {
			return
		}
		// Steps 5 and 6 are done on rank 0, and rank 1 took part in them.
		select {
		case <-entered:
		case <-time.After(backstop):
			t.Error("no write of step 4 started")
		}
		if _, err := os.Stat(filepath.Join(dir, ckpt.StepDirName(4), ckpt.ManifestName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("step 4 committed while its write was held: %v", err)
		}
		reached = append(reached, tr.step)
		close(release)
	})
	res := runRanks(t, s, 2, nil)
	if len(timedOut) > 0 || !slices.Equal(reached, []int{6}) {
		t.Fatalf("training did not go on while the write was held (released by the backstop: %d; reached %v)", len(timedOut), reached)
	}
	for _, step := range []int64{4, 8} {
		if _, err := ckpt.Open(t.Context(), filepath.Join(dir, ckpt.StepDirName(step))); err != nil {
			t.Errorf("step %d: %v", step, err)
		}
	}
	if res[1].Checkpoint != filepath.Join(dir, ckpt.StepDirName(8)) {
		t.Errorf("rank 1's last checkpoint %q, want step 8's", res[1].Checkpoint)
	}
}

// TestAsyncWriteErrorSurfaces: rank 1 cannot write its step-4 file (a
// directory stands where it goes). Both ranks fail at the same later step
// boundary, rank 1 with its own error and rank 0 naming rank 1, each as
// "checkpoint step 4", and step 4 is no checkpoint.
func TestAsyncWriteErrorSurfaces(t *testing.T) {
	dir := t.TempDir()
	s := dpSpec(1, 2)
	s.Checkpoint = CkptSpec{Dir: dir, Every: 4, Async: true}
	setHook(t, &testHookAsyncWrite, func(rank, step int) {
		if rank == 1 && step == 4 {
			os.MkdirAll(filepath.Join(dir, ckpt.StepDirName(4), ckpt.RankFileName(1), "x"), 0o755)
		}
	})
	res := make([]Result, 2)
	errs := make([]error, 2)
	onRanksAll(t, 2, func(ctx context.Context, r int, e Env) {
		res[r], errs[r] = Run(ctx, s, e)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "train: checkpoint step 4: ") {
			t.Errorf("rank %d: %v, want the failed checkpoint of step 4", r, err)
		}
		if res[r].Steps <= 4 || res[r].Steps != res[0].Steps {
			t.Errorf("rank %d failed after step %d, rank 0 after %d: want both at the same step after 4", r, res[r].Steps, res[0].Steps)
		}
	}
	if errs[0] != nil && !strings.Contains(errs[0].Error(), "ranks [1] could not write their files") {
		t.Errorf("rank 0: %v, want it to name rank 1", errs[0])
	}
	if _, err := ckpt.Open(t.Context(), filepath.Join(dir, ckpt.StepDirName(4))); err == nil {
		t.Error("step 4 is a checkpoint although rank 1 could not write its file")
	}
}

// TestAsyncStopWaitsForWrite: a run that stops with a checkpoint still
// being written (env.StopAfter at a checkpoint's step) returns only once
// it is committed, and a preempted one saves its stop step after the one
// in flight: either way the job exits with its checkpoints durable.
func TestAsyncStopWaitsForWrite(t *testing.T) {
	s := dpSpec(1, 2)
	full := runRanks(t, s, 2, nil)[0]
	dir := t.TempDir()
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2, Async: true}
	res := runRanks(t, s, 2, func(e *Env) { e.StopAfter = 6 })
	if want := filepath.Join(dir, ckpt.StepDirName(6)); res[0].Checkpoint != want {
		t.Errorf("stopped after step 6 with checkpoint %q, want %s", res[0].Checkpoint, want)
	}
	if c, ok := NewestValid(t.Context(), dir); !ok || c.Step() != 6 {
		t.Errorf("newest checkpoint after the stop: %v", c)
	}

	dir = t.TempDir()
	s.Checkpoint.Dir = dir
	preempt := make(chan struct{})
	setHook(t, &testHookStep, func(tr *Trainer) {
		if tr.env.Rank == 1 && tr.step == 5 {
			close(preempt)
		}
	})
	res = runRanks(t, s, 2, func(e *Env) { e.Preempt = preempt })
	testHookStep = nil
	want := filepath.Join(dir, ckpt.StepDirName(6))
	if !res[0].Preempted || res[0].Checkpoint != want {
		t.Fatalf("preempted %v with checkpoint %q, want %s", res[0].Preempted, res[0].Checkpoint, want)
	}
	if got := stepDirs(t, dir); !slices.Equal(got, []string{ckpt.StepDirName(2), ckpt.StepDirName(4), ckpt.StepDirName(6)}) {
		t.Errorf("step directories %v, want steps 2, 4 and 6", got)
	}
	resumed := runRanks(t, s, 2, func(e *Env) { e.Resume = true })[0]
	if resumed.Resumed != 6 || !slices.Equal(resumed.Losses, full.Losses[6:]) {
		t.Errorf("resumed from step %d with losses %v; want step 6 and %v", resumed.Resumed, resumed.Losses, full.Losses[6:])
	}
}

// TestSnapshotReused: the second snapshot reuses the first one's buffer.
func TestSnapshotReused(t *testing.T) {
	var p snapshot
	a := []float32{1, 2, 3}
	s := rankSave{shard: []ckpt.Tensor{{Data: a}, {Data: a[:1]}}}
	p.take(&s)
	first := &p.buf[0]
	a[0] = 9
	if s.shard[0].Data[0] != 1 || p.bytes() != 16 {
		t.Fatalf("snapshot %v (%d bytes): not a copy of 4 elements", s.shard, p.bytes())
	}
	s = rankSave{shard: []ckpt.Tensor{{Data: a}, {Data: a[:1]}}}
	p.take(&s)
	if &p.buf[0] != first || &s.shard[0].Data[0] != first || s.shard[1].Data[0] != 9 {
		t.Errorf("the second snapshot did not reuse the first one's buffer")
	}
}

// onRanksAll runs f on n in-process ranks, each with its Env, and waits
// for all of them without failing the test on their errors: for tests of
// how ranks fail together.
func onRanksAll(t *testing.T, n int, f func(ctx context.Context, r int, e Env)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), backstop)
	defer cancel()
	trs := comm.NewInProc(n)
	commtest.Check(t, commtest.Run(n, nil, func(r int) error {
		c, err := comm.New(ctx, r, n, trs[r], comm.Options{Name: "dp", Timeout: time.Minute})
		if err != nil {
			return err
		}
		defer c.Close()
		f(ctx, r, Env{Rank: r, World: n, LocalWorld: n, Comm: c})
		return nil
	}))
}
