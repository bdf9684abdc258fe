package train

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// backstop bounds how long a test waits for a run that should return at
// once: far beyond any machine's time for it, it only turns a hang into a
// failure.
const backstop = 2 * time.Minute

// TestPreemptOneRankStopsAll: only rank 1 of 2 is preempted, before step 6.
// Both ranks must stop after the same step (6), save one valid checkpoint
// there although none was due, return Preempted without an error, and
// rank 0 must log where to continue; resumed, the run ends with the losses
// of an uninterrupted one.
func TestPreemptOneRankStopsAll(t *testing.T) {
	s := dpSpec(1, 2)
	s.Steps = 10
	full := runRanks(t, s, 2, nil)[0]

	dir := t.TempDir()
	s.Checkpoint = CkptSpec{Dir: dir, Every: 100}
	preempt := make(chan struct{})
	setHook(t, &testHookStep, func(tr *Trainer) {
		if tr.spec.Checkpoint.Dir == dir && tr.env.Rank == 1 && tr.step == 5 {
			close(preempt)
		}
	})
	var log bytes.Buffer
	res := runRanks(t, s, 2, func(e *Env) {
		if e.Rank == 1 {
			e.Preempt = preempt
		} else {
			e.Log = &log
		}
	})
	want := dir + "/" + ckpt.StepDirName(6)
	for r, res := range res {
		if !res.Preempted || res.Steps != 6 || res.Checkpoint != want {
			t.Errorf("rank %d: preempted %v after step %d, checkpoint %q; want preempted after step 6 with %s", r, res.Preempted, res.Steps, res.Checkpoint, want)
		}
	}
	if got := stepDirs(t, dir); !slices.Equal(got, []string{ckpt.StepDirName(6)}) {
		t.Errorf("checkpoints %v, want step 6 only", got)
	}
	if !strings.Contains(log.String(), "preempted at step 6: saved "+want+"; continue with gtrain resume "+dir) {
		t.Errorf("rank 0's log does not say where to continue:\n%s", log.String())
	}
	testHookStep = nil
	resumed := runRanks(t, s, 2, func(e *Env) { e.Resume = true })[0]
	if resumed.Resumed != 6 || !slices.Equal(resumed.Losses, full.Losses[6:]) {
		t.Errorf("resumed from step %d with losses %v; want step 6 and %v", resumed.Resumed, resumed.Losses, full.Losses[6:])
	}
}

// TestPreemptWhileBuilding: a rank preempted while it builds its trainer
// (as the second chunk of the synthetic corpus is generated, or as the
// third tensor of the initialisation is about to start) gives up there,
// going no further, training and saving nothing, and Run returns
// Preempted; so does one preempted before Run. A cancelled context stops
// building with its cause.
func TestPreemptWhileBuilding(t *testing.T) {
	const (
		gen  = "generate or open the data"
		init = "initialise parameters"
	)
	for _, tc := range []struct {
		name   string
		phase  string // close Preempt at the closeN-th check before phase (none: before Run)
		closeN int
		cancel bool
	}{
		{"before", "", 0, false},
		{"during data generation", gen, 2, false},
		{"during initialisation", init, 3, false},
		{"context during initialisation", init, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := smallSpec(dir)
			s.Model = ModelSpec{Preset: "small"} // 6 blocks of 384: 75 tensors to initialise
			s.Data.Synthetic = 2_000_000         // about 30 chunks
			s.Batch.Seq = 64
			preempt := make(chan struct{})
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			stop := func() {
				if tc.cancel {
					cancel(errors.New("second signal"))
				} else {
					close(preempt)
				}
			}
			if tc.phase == "" {
				stop()
			}
			checks := map[string]int{}
			setHook(t, &testHookInterrupted, func(next string) {
				if checks[next]++; next == tc.phase && checks[next] == tc.closeN {
					stop()
				}
			})
			type outcome struct {
				res Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := Run(ctx, s, Env{World: 1, Preempt: preempt})
				done <- outcome{res, err}
			}()
			var o outcome
			select {
			case o = <-done:
			case <-time.After(backstop):
				t.Fatalf("Run did not return within %v of being preempted", backstop)
			}
			switch {
			case tc.cancel:
				if o.err == nil || !strings.Contains(o.err.Error(), "second signal") || o.res.Preempted {
					t.Errorf("cancelled: %+v, %v; want the cause as the error", o.res, o.err)
				}
			case o.err != nil || !o.res.Preempted || o.res.Steps != 0 || o.res.Checkpoint != "":
				t.Errorf("Run: %+v, %v; want Preempted after no step, no checkpoint", o.res, o.err)
			}
			want := map[string]int{gen: 1} // preempted before Run: stops at the first check
			switch tc.phase {
			case gen:
				want = map[string]int{gen: tc.closeN}
			case init:
				want = map[string]int{gen: checks[gen], init: tc.closeN}
			}
			if checks[gen] < 2 && tc.phase == init {
				t.Errorf("the corpus was generated in %d chunk(s): want several, for the test to mean anything", checks[gen])
			}
			if !maps.Equal(checks, want) {
				t.Errorf("building checked %v times; want %v: nothing more after the stop", checks, want)
			}
			if dirs := stepDirs(t, dir); len(dirs) != 0 {
				t.Errorf("checkpoints written: %v", dirs)
			}
		})
	}
}
