package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/internal/enginejob"
)

// NewCmdResume wires `gtrain resume DIR`: the launch flags of run, and the
// job from the newest valid checkpoint in DIR.
func NewCmdResume(ios *IOStreams, sig *signals) *cobra.Command {
	opts := &RunOptions{LaunchOptions: newLaunchOptions(ios, sig)}
	cmd := &cobra.Command{
		Use:   "resume [flags] DIR",
		Short: "Restart a built-in engine job from its newest valid checkpoint",
		Long: `Restart a job of the built-in engine from the newest valid checkpoint in DIR
(its checkpoint.dir), with the job spec saved in that checkpoint; or, when DIR
is a step directory (DIR/step-00000100, as gtrain prints them), from exactly
that checkpoint. Resumed from an older step than the newest, the newer step
directories are moved into DIR/superseded-<time>/, out of the run's way. The
run continues with the same data order and optimizer state, so its loss curve
is the one the uninterrupted run would have had. Checkpoints without a valid
manifest or with a bad checksum are skipped with a warning. A directory in use
by a running job is refused (exit code 2), naming the job.

The hosts are this run's: give --hostfile (or --nproc-per-node) to move the
job; without them it runs on this machine with the checkpoint's world size.
On another number of ranks the checkpoint is resharded and the micro-batch
rescaled so that the global batch stays the same. --set changes job keys,
e.g. the ZeRO stage or the steps.`,
		Example: `  gtrain resume runs/20261122-193012
  gtrain resume runs/20261122-193012/step-00000100
  gtrain resume --hostfile hosts.txt /shared/ckpt/gpt2
  gtrain resume --nproc-per-node 2 --set parallel.zero_stage=1 runs/20261122-193012`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return resumeRun(cmd.Context(), opts, args[0], cmd.Flags().Changed("nproc-per-node"))
		},
	}
	f := cmd.Flags()
	addLaunchFlags(f, &opts.LaunchOptions)
	addOutputFlag(f, &opts.Output, "events (or the --dry-run job) as JSON lines on stdout")
	f.StringVar(&opts.Table, "table", "auto", "live status table on stderr: auto (when a terminal), always, never")
	f.BoolVar(&opts.DryRun, "dry-run", false, "resolve the checkpoint, hosts and environments, print the job, start nothing")
	f.StringArrayVar(&opts.Sets, "set", nil, "override a key of the checkpoint's job, e.g. --set steps=2000 (repeatable)")
	addRestartFlag(f, &opts.LaunchOptions)
	addMetricsFlag(f, opts)
	return cmd
}

// resumeRun continues the built-in engine's job of path, prepared by
// enginejob.Resume, which holds its checkpoint directory until the job
// ends. nprocSet says whether --nproc-per-node was given: without it (and
// a hostfile) the job keeps the checkpoint's number of ranks.
func resumeRun(ctx context.Context, o *RunOptions, path string, nprocSet bool) error {
	if err := o.check(); err != nil {
		return err
	}
	eo := o.engineOptions()
	eo.Sets, eo.RanksGiven = o.Sets, nprocSet
	j, err := enginejob.Resume(ctx, path, eo)
	if err != nil {
		return err
	}
	defer j.Release()
	fmt.Fprintf(o.IO.Err, "gtrain: resuming from %s (step %d)\n", j.From.Dir, j.From.Manifest.Step)
	return o.launchEngine(ctx, j)
}
