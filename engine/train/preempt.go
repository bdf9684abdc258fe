package train

import (
	"context"
	"errors"
	"fmt"
)

// ErrPreempted is NewContext's error when Env.Preempt was closed before the
// trainer was built; Run turns it into a Result with Preempted set.
var ErrPreempted = errors.New("train: preempted before training started")

// preempted reports whether ch is closed, without waiting.
func preempted(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// testHookInterrupted, when set by a test, is called at every point where
// building may give up, with what comes next.
var testHookInterrupted func(next string)

// interrupted is the error with which building gives up before next: ctx's
// cause when it has ended, ErrPreempted when the rank was preempted.
func (t *Trainer) interrupted(ctx context.Context, next string) error {
	if testHookInterrupted != nil {
		testHookInterrupted(next)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("train: stopped before %s: %w", next, context.Cause(ctx))
	}
	if preempted(t.env.Preempt) {
		return ErrPreempted
	}
	return nil
}

// logPreempted tells the user where the job stopped and how to go on.
func (t *Trainer) logPreempted(saved string) {
	if saved == "" {
		t.logf("preempted at step %d: no checkpoint.dir, nothing saved", t.step)
		return
	}
	t.logf("preempted at step %d: saved %s; continue with gtrain resume %s", t.step, saved, t.spec.Checkpoint.Dir)
}
