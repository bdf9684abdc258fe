package train

import (
	"bytes"
	"context"
	"errors"
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

// TestPreemptWhileBuilding: a rank preempted while its model is being
// built (here as the third tensor of the initialisation is about to
// start) gives up there, initialising no further tensor, training and
// saving nothing, and Run returns Preempted;
// so does one preempted before Run. A cancelled context stops building
// with its cause.
func TestPreemptWhileBuilding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		closeN int // close Preempt at this call of the hook (0: before Run)
		cancel bool
	}{
		{"before", 0, false},
		{"during initialisation", 3, false},
		{"context during initialisation", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := smallSpec(dir)
			s.Model = ModelSpec{Preset: "small"} // 6 blocks of 384: 75 tensors to initialise
			s.Data.Synthetic = 20_000
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
			if tc.closeN == 0 {
				stop()
			}
			var inits int
			var phases []string
			setHook(t, &testHookInterrupted, func(next string) {
				if len(phases) == 0 || phases[len(phases)-1] != next {
					phases = append(phases, next)
				}
				if next == "initialise parameters" {
					if inits++; inits == tc.closeN {
						stop()
					}
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
			if tc.closeN == 0 && slices.Contains(phases, "initialise parameters") {
				t.Errorf("preempted before Run, building went on to %v", phases)
			}
			if tc.closeN > 0 && inits != tc.closeN {
				t.Errorf("initialisation went on to tensor %d after being stopped before tensor %d", inits, tc.closeN)
			}
			if dirs := stepDirs(t, dir); len(dirs) != 0 {
				t.Errorf("checkpoints written: %v", dirs)
			}
		})
	}
}
