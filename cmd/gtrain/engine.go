package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/launch"
)

// useEngine makes the run's ranks the built-in engine training spec:
// `gtrain worker`, with the resolved spec in their environment.
func (o *RunOptions) useEngine(spec train.Spec, resume bool) error {
	dir, err := o.workDir()
	if err != nil {
		return err
	}
	spec, js, err := engineJob(spec, dir, time.Now())
	if err != nil {
		return err
	}
	ckDir := spec.Checkpoint.Dir
	if !resume {
		if err := checkFreshCheckpointDir(ckDir); err != nil {
			return err
		}
	}
	o.Command = []string{"gtrain", "worker"}
	if resume {
		o.Command = append(o.Command, "--resume")
	}
	o.Env = append(slices.Clip(o.Env), EnvJobSpec+"="+js)
	c := spec.Model.Config
	fmt.Fprintf(o.IO.Err, "gtrain: built-in engine: GPT-2 %d layers × %d hidden, %d steps; checkpoints in %s\n",
		c.Layers, c.Embd, spec.Steps, ckDir)
	return nil
}

// checkFreshCheckpointDir refuses to start a new run in a directory that
// holds another run's checkpoints: continuing it is `gtrain resume`, and
// mixing two runs' steps in one directory loses one of them.
func checkFreshCheckpointDir(dir string) error {
	c, ok := train.NewestValid(dir)
	if !ok {
		return nil // absent, empty or only unfinished writes: start afresh
	}
	return &launch.UsageError{Err: fmt.Errorf("run: checkpoint.dir %s already holds %s of a run: continue it with `gtrain resume %s`, or set another checkpoint.dir",
		dir, filepath.Base(c.Dir), dir)}
}

// NewCmdResume wires `gtrain resume DIR`: the launch flags of run, and the
// job from the newest valid checkpoint in DIR.
func NewCmdResume(ios *IOStreams, sig *signals) *cobra.Command {
	opts := &RunOptions{IO: ios, Signals: sig}
	cmd := &cobra.Command{
		Use:   "resume [flags] DIR",
		Short: "Restart a built-in engine job from its newest valid checkpoint",
		Long: `Restart a job of the built-in engine from the newest valid checkpoint in DIR
(its checkpoint.dir), with the job spec saved in that checkpoint. The run
continues with the same data order and optimizer state, so its loss curve is
the one the uninterrupted run would have had. Checkpoints without a valid
manifest or with a bad checksum are skipped with a warning.

The hosts are this run's: give --hostfile (or --nproc-per-node) to move the
job; without them it runs on this machine with the checkpoint's world size.
On another number of ranks the checkpoint is resharded and the micro-batch
rescaled so that the global batch stays the same. --set changes job keys,
e.g. the ZeRO stage or the steps.`,
		Example: `  gtrain resume runs/20261122-193012
  gtrain resume --hostfile hosts.txt /shared/ckpt/gpt2
  gtrain resume --nproc-per-node 2 --set parallel.zero_stage=1 runs/20261122-193012`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := applyConfig(cmd, ios.Getenv); err != nil {
				return err
			}
			return resumeRun(cmd.Context(), opts, args[0], cmd.Flags().Changed("nproc-per-node"))
		},
	}
	f := cmd.Flags()
	addLaunchFlags(f, opts)
	f.StringVarP(&opts.Output, "output", "o", "text", "text, or json: events as JSON on stdout")
	f.StringVar(&opts.Table, "table", "auto", "live status table on stderr: auto (when a terminal), always, never")
	f.BoolVar(&opts.DryRun, "dry-run", false, "resolve the checkpoint, hosts and environments, print the plan, start nothing")
	f.StringArrayVar(&opts.Sets, "set", nil, "override a key of the checkpoint's job, e.g. --set steps=2000 (repeatable)")
	return cmd
}

func resumeRun(ctx context.Context, o *RunOptions, dir string, nprocSet bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	c, err := ckpt.Latest(abs, func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) })
	if err != nil {
		if errors.Is(err, ckpt.ErrNoCheckpoint) {
			return &launch.UsageError{Err: fmt.Errorf("resume: %s: no valid checkpoint to resume from (see `gtrain ckpt ls %s`)", dir, dir)}
		}
		return fmt.Errorf("resume: %w", err)
	}
	var spec train.Spec
	if err := json.Unmarshal(c.Manifest.Job, &spec); err != nil {
		return fmt.Errorf("resume: %s: job spec in manifest: %w", c.Dir, err)
	}
	if len(o.Sets) > 0 {
		if spec, err = overlayJob(spec, o.Sets); err != nil {
			return err
		}
	}
	spec.Checkpoint.Dir = abs // the directory may have moved since
	if o.Hostfile == "" && !nprocSet && c.Manifest.Layout.World > 0 {
		o.NprocPerNode = c.Manifest.Layout.World
	}
	o.Command = nil
	if err := o.check(); err != nil {
		return err
	}
	fmt.Fprintf(o.IO.Err, "gtrain: resuming from %s (step %d)\n", c.Dir, c.Manifest.Step)
	if err := o.useEngine(spec, true); err != nil {
		return err
	}
	return o.launch(ctx)
}
