package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/jobfile"
)

// WorkerOptions are the inputs of `gtrain worker`, one rank of the built-in
// engine.
type WorkerOptions struct {
	IO      *IOStreams
	Signals *signals
	Job     string   // job file, when not started by the launcher
	Sets    []string // key=value overrides of the job file
	Resume  bool
	From    string // a step directory to resume from (--resume-from)
	IfAny   bool   // --resume-if-any: the newest valid checkpoint if any, else afresh
}

// NewCmdWorker is the hidden command every rank of the built-in engine runs.
// Under `gtrain run` the job arrives resolved in GTRAIN_JOB_SPEC; run alone,
// it trains one rank from --job (or the default job) in this process.
//
// SIGTERM or SIGUSR1 asks it to stop for preemption: it saves a checkpoint
// at the next step boundary and exits with launch.ExitResumable (75); a
// second signal stops it at once.
func NewCmdWorker(ios *IOStreams, sig *signals) *cobra.Command {
	opts := &WorkerOptions{IO: ios, Signals: sig}
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "Run one rank of the built-in training engine",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return workerRun(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Job, "job", "", "YAML job file (default: the built-in default job)")
	f.StringArrayVar(&opts.Sets, "set", nil, "override a job key, e.g. --set optim.lr=3e-4 (repeatable)")
	f.BoolVar(&opts.Resume, "resume", false, "continue from the newest valid checkpoint in the job's checkpoint.dir")
	f.StringVar(&opts.From, "resume-from", "", "continue from this step directory instead of the newest")
	f.BoolVar(&opts.IfAny, "resume-if-any", false, "continue from the newest valid checkpoint if there is one, else start afresh (a per-node job started again)")
	return cmd
}

func workerRun(ctx context.Context, o *WorkerOptions) error {
	return workerExit(train.RunRank(ctx, train.RankOptions{
		Getenv:   o.IO.Getenv,
		LoadJob:  func(ctx context.Context) (train.Spec, error) { return jobfile.Load(ctx, o.Job, o.Sets) },
		JobFlags: o.Job != "" || len(o.Sets) > 0,
		Resume:   o.Resume, ResumeFrom: o.From, ResumeIfAny: o.IfAny,
		// Before anything slow: a preemption while the model is built
		// must not cancel ctx, the trainer returns promptly on its own.
		Preempt:       o.Signals.catchPreemption(),
		PreemptSignal: o.Signals.preemptSignal,
		Log:           o.IO.Out,
		Warn:          func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) },
	}))
}

// workerExit reports a rank that a preemption stopped (*train.StopError,
// whose exit code ExitCode gives: ExitResumable when the job can resume
// from a checkpoint, else 128+n) once: the trainer may already have said
// where it saved.
func workerExit(err error) error {
	var stop *train.StopError
	if errors.As(err, &stop) && stop.Saved {
		return &silentError{err}
	}
	return err
}
