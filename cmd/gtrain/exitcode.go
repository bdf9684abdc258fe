package main

import (
	"errors"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/launch"
)

// Exit codes of gtrain (documented in README.md). Besides these, gtrain exits
// with the exit code of the rank whose failure caused the job's (see
// launch.RankFailedError), and with 128+n when it was interrupted by signal n.
const (
	ExitOK      = 0 // every rank exited 0
	ExitFailure = 1 // gtrain itself failed: an agent was lost, a process could not start, I/O
	ExitUsage   = 2 // bad flags, config, job file, hostfile or filter
	// ExitResumable: stopped by SIGTERM or SIGUSR1 (preemption) after every
	// rank saved its state; continue with `gtrain resume DIR`.
	ExitResumable = launch.ExitResumable
)

// ExitCode maps an error to gtrain's exit code. It is the only place that
// does.
func ExitCode(err error) int {
	var (
		rank   *launch.RankFailedError
		intr   *launch.InterruptedError
		saved  *launch.ResumableError
		stop   *train.StopError // a rank of the built-in engine stopped by a signal
		usage  *usage.Error
		parse  *hostfiles.ParseError
		locked *ckpt.LockedError  // the checkpoint dir is another job's
		input  *userfile.Error    // a file the user named cannot be used
		memory *train.MemoryError // the job cannot fit in a host's memory
	)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &rank):
		if rank.Code <= 0 || rank.Code > 255 {
			return ExitFailure
		}
		return rank.Code
	case errors.As(err, &saved):
		return ExitResumable
	case errors.As(err, &stop):
		if stop.Resumable() {
			return ExitResumable
		}
		return (&launch.InterruptedError{Signal: stop.Signal}).Code()
	case errors.As(err, &intr):
		return intr.Code()
	case errors.As(err, &usage), errors.As(err, &parse), errors.As(err, &locked), errors.As(err, &input),
		errors.As(err, &memory):
		return ExitUsage
	default:
		return ExitFailure
	}
}
