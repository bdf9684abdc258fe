package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

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
	return cmd
}

func workerRun(ctx context.Context, o *WorkerOptions) error {
	spec, err := o.spec()
	if err != nil {
		return err
	}
	env, closeStatus, err := rankEnv(o.IO)
	if err != nil {
		return err
	}
	defer closeStatus()
	env.Resume = o.Resume
	env.Log = o.IO.Out
	env.Warn = func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) }
	res, err := train.Run(ctx, spec, env)
	if err != nil {
		return err
	}
	switch {
	case res.Checkpoint == "":
	case res.Steps < spec.Steps:
		fmt.Fprintf(o.IO.Out, "saved %s; continue with: gtrain resume %s\n", res.Checkpoint, spec.Checkpoint.Dir)
	default:
		fmt.Fprintf(o.IO.Out, "saved %s; export the weights with: gtrain ckpt export %s -o model.safetensors\n", res.Checkpoint, spec.Checkpoint.Dir)
	}
	return nil
}

// spec is the launcher's resolved spec, else the job file with overrides.
func (o *WorkerOptions) spec() (train.Spec, error) {
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
	spec, err := loadJob(o.Job, o.Sets)
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

// rankEnv reads the rank's place in the job from the torchrun variables
// (absent: a single rank) and opens the agent's status pipe.
func rankEnv(ios *IOStreams) (train.Env, func(), error) {
	env := train.Env{World: 1, LocalWorld: 1}
	for _, v := range []struct {
		name string
		dst  *int
	}{{"RANK", &env.Rank}, {"WORLD_SIZE", &env.World}, {"LOCAL_WORLD_SIZE", &env.LocalWorld}} {
		s := ios.Getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return env, nil, fmt.Errorf("worker: %s=%q: want a non-negative integer", v.name, s)
		}
		*v.dst = n
	}
	closeStatus := func() {}
	if s := ios.Getenv("GTRAIN_STATUS_FD"); s != "" {
		fd, err := strconv.Atoi(s)
		if err != nil || fd < 3 {
			return env, nil, fmt.Errorf("worker: GTRAIN_STATUS_FD=%q: want a file descriptor number ≥ 3", s)
		}
		f := os.NewFile(uintptr(fd), "status")
		env.Status = f
		closeStatus = func() { f.Close() }
	}
	return env, closeStatus, nil
}
