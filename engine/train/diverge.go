package train

import (
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/engine/comm"
)

// testHookStep, when set by a test, is called before every step (to
// poison the state, or preempt a rank, at a chosen step).
var testHookStep func(t *Trainer)

// DivergedError ends a run whose numbers stopped being finite: the loss,
// the gradient norm, the validation loss or the parameters became NaN or
// infinite (with fp16, an overflow that halving the loss scale could not
// absorb). Nothing from Step on was saved; Checkpoint is the newest
// checkpoint of the run, all finite ("" when there is none).
type DivergedError struct {
	Step       int    // the step that produced them
	What       string // e.g. "loss NaN, gradient norm NaN"
	Checkpoint string
	Precision  string
	LR         float64 // optim.lr of the run
	GradClip   float64 // optim.grad_clip of the run
}

func (e *DivergedError) Error() string {
	try := []string{"a lower optim.lr"}
	if e.GradClip == 0 {
		try = append(try, "gradient clipping (optim.grad_clip: 1)")
	}
	if e.Precision == "fp16" {
		try = append(try, "bf16 instead of fp16")
	}
	then := fmt.Sprintf("then start the run again (no checkpoint was saved before step %d)", e.Step)
	if e.Checkpoint != "" {
		then = fmt.Sprintf("then continue from the last checkpoint, all finite (an earlier one if it diverges again): gtrain resume --set optim.lr=%g %s", e.LR/10, e.Checkpoint)
	}
	list := strings.Join(try[:len(try)-1], ", ")
	if list != "" {
		list += " or "
	}
	return fmt.Sprintf("train: step %d: %s: training diverged and was stopped without saving this step. Try %s%s; %s",
		e.Step, e.What, list, try[len(try)-1], then)
}

// diverged is the error for the step of r.
func (t *Trainer) diverged(r Record) error {
	// An asynchronous checkpoint in flight was of a finite state: complete
	// it, so that the error names it (every rank diverges at this step).
	if _, err := t.finishSaves(); err != nil {
		t.env.Warn(err.Error())
	}
	var what []string
	add := func(name string, v float64) {
		if !finite(v) {
			what = append(what, fmt.Sprintf("%s %v", name, v))
		}
	}
	add("loss", float64(r.Loss))
	add("gradient norm", r.GradNorm)
	if r.ValLoss != nil {
		add("validation loss", float64(*r.ValLoss))
	}
	if t.spec.Precision == "fp16" && len(what) > 0 && r.ValLoss == nil {
		what = append(what, fmt.Sprintf("an fp16 overflow that the loss scale (%g, its least) cannot absorb", t.scaler().LossScale()))
	}
	return t.divergedError(r.Step, strings.Join(what, ", "))
}

func (t *Trainer) divergedError(step int, what string) *DivergedError {
	o := t.spec.Optim
	return &DivergedError{Step: step, What: what, Checkpoint: t.saved, Precision: t.spec.Precision, LR: o.LR, GradClip: o.GradClip}
}

// save writes a checkpoint of the current step, after checking on every
// rank that the state it would write is finite: a checkpoint of NaNs
// could only diverge again when resumed, and with checkpoint.keep it would
// push the last good one out.
func (t *Trainer) save() (string, error) {
	if err := t.checkFinite(); err != nil {
		return "", err
	}
	dir, err := t.SaveCheckpoint()
	if err == nil {
		t.saved = dir
	}
	return dir, err
}

// checkFinite refuses, on every rank, a checkpoint of a state that is not
// finite on some rank.
func (t *Trainer) checkFinite() error {
	var bad float32
	if t.grid != nil {
		bad = float32(t.grid.nonFinite())
	} else {
		bad = float32(t.zero.NonFinite())
	}
	if t.env.Comm != nil {
		v := []float32{bad}
		if err := t.env.Comm.AllReduce(t.ctx(), comm.F32(v), comm.Max); err != nil {
			return fmt.Errorf("train: checkpoint step %d: %w", t.step, err)
		}
		bad = v[0]
	}
	if bad > 0 {
		return t.divergedError(t.step, "parameters or optimizer state not finite, so its checkpoint was refused")
	}
	return nil
}
