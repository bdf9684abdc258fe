package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/dist"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
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
	return cmd
}

func workerRun(ctx context.Context, o *WorkerOptions) (err error) {
	// Before anything slow: a preemption while the model is built must
	// not cancel ctx, the trainer returns promptly on its own.
	preempt := o.Signals.catchPreemption()
	defer func() {
		if err != nil {
			writeErrorFile(o.IO.Getenv("TORCHELASTIC_ERROR_FILE"), err)
		}
	}()
	// Until the trainer runs there is nothing to save: reading the job and
	// joining the other ranks stop at the first signal.
	setup, endSetup := o.untilPreempted(ctx, preempt)
	spec, err := o.spec(setup)
	if err != nil {
		endSetup()
		return err
	}
	env, closeEnv, err := rankEnv(setup, o.IO)
	endSetup()
	if err != nil {
		return err
	}
	defer closeEnv()
	env.Resume, env.ResumeFrom = o.Resume, o.From
	env.RunID = o.IO.Getenv("TORCHELASTIC_RUN_ID")
	// A restart of the job (--max-restarts) continues from the newest
	// checkpoint this job wrote, rather than refusing its own directory
	// (or, resumed from a step directory, setting its own newer ones aside).
	env.Restart = restartCount(o.IO.Getenv) > 0
	env.Preempt = preempt
	env.Log = o.IO.Out
	env.Warn = func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) }
	failAt, err := faultStep(o.IO.Getenv, env.Restart)
	if err != nil {
		return err
	}
	env.StopAfter = failAt
	res, err := train.Run(ctx, spec, env)
	if err != nil {
		return err
	}
	if res.Preempted {
		return o.preempted(ctx, res, spec.Checkpoint.Dir)
	}
	if failAt > 0 && res.Steps == failAt && failAt < spec.Steps {
		return fmt.Errorf("worker: %s=%d: failing after step %d on purpose (fault injection for tests)", envFailAfter, failAt, failAt)
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

// preempted is how a rank that stopped for preemption ends: with
// ExitResumable when it saved a checkpoint (the trainer has said where),
// else as interrupted (128+n).
func (o *WorkerOptions) preempted(ctx context.Context, res train.Result, dir string) error {
	sig := o.Signals.preemptSignal()
	if sig == nil {
		sig = syscall.SIGTERM
	}
	if res.Checkpoint == "" {
		// Stopped while building: resumable all the same when the job
		// (a resume or a restart) already has a checkpoint to go on from.
		if c, ok := train.NewestValid(ctx, dir); dir != "" && ok {
			fmt.Fprintf(o.IO.Err, "gtrain: worker: stopped by %s before training; the job resumes from %s\n", unix.SignalName(sig.(syscall.Signal)), c.Dir)
			return &silentError{&launch.ResumableError{Signal: sig}}
		}
		fmt.Fprintf(o.IO.Err, "gtrain: worker: stopped by %s before a checkpoint was saved\n", unix.SignalName(sig.(syscall.Signal)))
		return &silentError{&launch.InterruptedError{Signal: sig}}
	}
	return &silentError{&launch.ResumableError{Signal: sig}}
}

// untilPreempted is ctx, cancelled also by a preemption until the returned
// func is called. The derived context is never cancelled after that, since
// the links set up under it live on into training.
func (o *WorkerOptions) untilPreempted(ctx context.Context, preempt <-chan struct{}) (context.Context, func()) {
	setup, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-preempt:
			sig := o.Signals.preemptSignal()
			if sig == nil {
				sig = syscall.SIGTERM
			}
			cancel(&launch.InterruptedError{Signal: sig})
		case <-done:
		case <-setup.Done():
		}
	}()
	return setup, func() { close(done) }
}

// restartCount is the launcher's TORCHELASTIC_RESTART_COUNT: 0 for the
// first attempt of a job (or a rank started alone).
func restartCount(getenv func(string) string) int {
	n, err := strconv.Atoi(getenv("TORCHELASTIC_RESTART_COUNT"))
	if err != nil {
		return 0
	}
	return n
}

// envFailAfter makes the first attempt of a job fail after the given step,
// after its checkpoints up to there: a fault injection that lets the tests
// of --max-restarts fail a real rank at a known point.
const envFailAfter = "GTRAIN_FAULT_FAIL_AFTER_STEP"

// faultStep is the step envFailAfter asks the first attempt to fail after,
// or 0.
func faultStep(getenv func(string) string, restart bool) (int, error) {
	v := getenv(envFailAfter)
	if v == "" || restart {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, usage.Errorf("worker: %s=%q: want a step number ≥ 1", envFailAfter, v)
	}
	return n, nil
}

// writeErrorFile records err in the rank's TORCHELASTIC_ERROR_FILE, in the
// form torch's @record writes, so that the launcher's failure report quotes
// it; "peer_failed" tells the launcher the rank failed only because a peer
// died, so it blames the peer. Best effort: the exit code says the rest.
func writeErrorFile(path string, err error) {
	if path == "" {
		return
	}
	type message struct {
		Message   string            `json:"message"`
		ExtraInfo map[string]string `json:"extraInfo"`
	}
	b, jerr := json.Marshal(struct {
		Message    message `json:"message"`
		PeerFailed bool    `json:"peer_failed,omitempty"`
	}{
		Message:    message{Message: err.Error(), ExtraInfo: map[string]string{"timestamp": strconv.FormatInt(time.Now().Unix(), 10)}},
		PeerFailed: peerFailed(err),
	})
	if jerr == nil {
		_ = os.WriteFile(path, b, 0o600)
	}
}

// peerFailed says whether err is this rank's reaction to a peer's failure:
// the link to a peer closed, its process is gone, or it stopped answering.
func peerFailed(err error) bool {
	var pe *comm.PeerError
	return errors.As(err, &pe) || errors.Is(err, comm.ErrPeerGone) || errors.Is(err, comm.ErrPeerClosed)
}

// spec is the launcher's resolved spec, else the job file with overrides.
func (o *WorkerOptions) spec(ctx context.Context) (train.Spec, error) {
	if js := o.IO.Getenv(EnvJobSpec); js != "" {
		if o.Job != "" || len(o.Sets) > 0 {
			return train.Spec{}, usage.Errorf("worker: %s is set by the launcher; --job and --set cannot change it", EnvJobSpec)
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
