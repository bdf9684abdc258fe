package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/dist"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/launch"
)

// WorkerOptions are the inputs of `gtrain worker`, one rank of the built-in
// engine.
type WorkerOptions struct {
	IO     *IOStreams
	Job    string   // job file, when not started by the launcher
	Sets   []string // key=value overrides of the job file
	Resume bool
	From   string // a step directory to resume from (--resume-from)
}

// NewCmdWorker is the hidden command every rank of the built-in engine runs.
// Under `gtrain run` the job arrives resolved in GTRAIN_JOB_SPEC; run alone,
// it trains one rank from --job (or the default job) in this process.
func NewCmdWorker(ios *IOStreams) *cobra.Command {
	opts := &WorkerOptions{IO: ios}
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
	return cmd
}

func workerRun(ctx context.Context, o *WorkerOptions) error {
	spec, err := o.spec(ctx)
	if err != nil {
		return err
	}
	env, closeEnv, err := rankEnv(ctx, o.IO)
	if err != nil {
		return err
	}
	defer closeEnv()
	env.Resume, env.ResumeFrom = o.Resume, o.From
	env.RunID = o.IO.Getenv("TORCHELASTIC_RUN_ID")
	env.Log = o.IO.Out
	env.Warn = func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) }
	res, err := train.Run(ctx, spec, env)
	if err != nil {
		return err
	}
	switch {
	case res.Checkpoint == "" || env.Rank != 0:
	case res.Steps < spec.Steps:
		fmt.Fprintf(o.IO.Out, "saved %s; continue with: gtrain resume %s\n", res.Checkpoint, spec.Checkpoint.Dir)
	default:
		fmt.Fprintf(o.IO.Out, "saved %s; export the weights with: gtrain ckpt export %s -o model.safetensors\n", res.Checkpoint, spec.Checkpoint.Dir)
	}
	return nil
}

// spec is the launcher's resolved spec, else the job file with overrides.
func (o *WorkerOptions) spec(ctx context.Context) (train.Spec, error) {
	if js := o.IO.Getenv(EnvJobSpec); js != "" {
		if o.Job != "" || len(o.Sets) > 0 {
			return train.Spec{}, &launch.UsageError{Err: fmt.Errorf("worker: %s is set by the launcher; --job and --set cannot change it", EnvJobSpec)}
		}
		var spec train.Spec
		if err := json.Unmarshal([]byte(js), &spec); err != nil {
			return spec, fmt.Errorf("worker: %s: %w", EnvJobSpec, err)
		}
		return spec, nil
	}
	spec, err := loadJob(ctx, o.Job, o.Sets)
	if err != nil {
		return spec, err
	}
	dir, err := os.Getwd()
	if err != nil {
		return spec, err
	}
	spec, _, err = engineJob(spec, dir, time.Now())
	return spec, err
}

// rankEnv is the rank's place in the job. Started by the launcher with
// more than one rank, it joins the others through the job's store
// (engine/dist) and gets the data-parallel communicator; alone (no
// WORLD_SIZE, or 1) it is a single rank. It also opens the agent's status
// pipe. The returned func closes both.
func rankEnv(ctx context.Context, ios *IOStreams) (train.Env, func(), error) {
	env := train.Env{World: 1, LocalWorld: 1}
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	if s := ios.Getenv("GTRAIN_STATUS_FD"); s != "" {
		fd, err := strconv.Atoi(s)
		if err != nil || fd < 3 {
			return env, nil, fmt.Errorf("worker: GTRAIN_STATUS_FD=%q: want a file descriptor number ≥ 3", s)
		}
		f := os.NewFile(uintptr(fd), "status")
		env.Status = f
		closers = append(closers, func() { f.Close() })
	}
	if ws := ios.Getenv("WORLD_SIZE"); ws == "" || ws == "1" {
		return env, closeAll, nil
	}
	de, err := dist.FromEnv(ios.Getenv)
	if err != nil {
		closeAll()
		return env, nil, fmt.Errorf("worker: %w", err)
	}
	w, err := dist.Init(ctx, de, dist.Options{Comm: comm.Options{Name: "dp"}})
	if err != nil {
		closeAll()
		return env, nil, fmt.Errorf("worker: %w", err)
	}
	closers = append(closers, func() { w.Close() })
	env.Rank, env.World, env.LocalWorld, env.Comm = de.Rank, de.WorldSize, de.LocalWorldSize, w.Comm
	return env, closeAll, nil
}
