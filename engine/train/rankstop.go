package train

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// StopError is how RunRank ends when a preemption signal (SIGTERM or
// SIGUSR1, forwarded by the agent) stopped the rank. The caller gives the
// rank's exit code from it: resumable (75) when the job has a checkpoint
// to go on from, else interrupted (128+n).
type StopError struct {
	Signal os.Signal
	// Trainer: the signal reached the trainer, which stopped at a step
	// boundary or while it was being built. False: it came while the rank
	// read its job or joined the others, and interrupted that.
	Trainer bool
	// Checkpoint is what the job resumes from: the checkpoint this rank
	// saved at the signal (Saved), or the job's newest when the signal came
	// before training; "" when there is none.
	Checkpoint string
	// Saved: this rank saved Checkpoint at the signal, and the trainer has
	// said so on its log; the caller need not say it again.
	Saved bool
}

// Resumable reports whether the job can resume after the stop: there is a
// checkpoint to go on from.
func (e *StopError) Resumable() bool { return e.Checkpoint != "" }

func (e *StopError) Error() string {
	sig := signalName(e.Signal)
	switch {
	case !e.Trainer:
		return "interrupted by " + sig
	case e.Saved:
		return fmt.Sprintf("worker: stopped by %s: saved %s", sig, e.Checkpoint)
	case e.Checkpoint != "":
		return fmt.Sprintf("worker: stopped by %s before training; the job resumes from %s", sig, e.Checkpoint)
	default:
		return fmt.Sprintf("worker: stopped by %s before a checkpoint was saved", sig)
	}
}

// stopped is the *StopError of a rank whose trainer stopped for
// preemption with res.
func (o RankOptions) stopped(ctx context.Context, res Result, dir string) error {
	e := &StopError{Signal: o.signal(), Trainer: true, Checkpoint: res.Checkpoint, Saved: res.Checkpoint != ""}
	if !e.Saved && dir != "" {
		// Stopped while building: resumable all the same when the job (a
		// resume or a restart) already has a checkpoint to go on from.
		if c, ok := NewestValid(ctx, dir); ok {
			e.Checkpoint = c.Dir
		}
	}
	return e
}

// untilPreempted is ctx, cancelled also by a preemption (with a
// *StopError) until the returned func is called. The derived context is
// never cancelled after that, since the links set up under it live on into
// training.
func (o RankOptions) untilPreempted(ctx context.Context) (context.Context, func()) {
	setup, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-o.Preempt:
			cancel(&StopError{Signal: o.signal()})
		case <-done:
		case <-setup.Done():
		}
	}()
	return setup, func() { close(done) }
}

// signal is the signal that closed Preempt; SIGTERM when none is known.
func (o RankOptions) signal() os.Signal {
	if o.PreemptSignal != nil {
		if sig := o.PreemptSignal(); sig != nil {
			return sig
		}
	}
	return syscall.SIGTERM
}

// signalName is "SIGUSR1" rather than Go's "user defined signal 1".
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return fmt.Sprint(s)
}
