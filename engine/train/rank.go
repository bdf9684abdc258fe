package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/dist"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// RankOptions are what a rank of the built-in engine (`gtrain worker`) is
// started with besides the environment the launcher gives it.
type RankOptions struct {
	// Getenv reads the rank's environment (os.Getenv in production): the
	// torchrun contract and gtrain's variables, named in internal/rankenv.
	Getenv func(string) string
	// LoadJob reads the job of a rank started without the launcher's
	// resolved spec (rankenv.JobSpec unset): the job file with its
	// overrides. It returns when its ctx ends. RunRank resolves the job as
	// the launcher does (ResolveIn, in the working directory).
	LoadJob func(ctx context.Context) (Spec, error)
	// JobFlags: the user named a job file or overrides (--job, --set),
	// which cannot change the launcher's spec.
	JobFlags bool
	// Resume and ResumeFrom are Env's.
	Resume     bool
	ResumeFrom string
	// ResumeIfAny starts the rank as a restart of its job does (Env.Restart):
	// from the newest valid checkpoint of checkpoint.dir if there is one,
	// else afresh. A per-node job started again by its scheduler with the
	// same id continues so; its launcher has checked the directory is the
	// job's own.
	ResumeIfAny bool
	// Preempt is closed when the rank is asked to stop for preemption, as
	// Env.Preempt; PreemptSignal then names the signal that asked (nil is
	// taken for SIGTERM, the launcher's).
	Preempt       <-chan struct{}
	PreemptSignal func() os.Signal
	// Log takes the progress lines and the closing hint (stdout); Warn
	// the warnings.
	Log  io.Writer
	Warn func(string)
}

// RunRank runs one rank of the built-in engine to its end: it reads its
// job (the launcher's resolved spec, else LoadJob's), joins the job's other
// ranks (engine/dist) and trains. A restart of the job (--max-restarts)
// continues from the newest checkpoint the job wrote. An error is also
// recorded in the rank's TORCHELASTIC_ERROR_FILE, for the launcher's
// report. A rank stopped by preemption returns a *StopError, which says
// whether the job can resume.
func RunRank(ctx context.Context, o RankOptions) (err error) {
	defer func() {
		if err != nil {
			dist.WriteErrorFile(o.Getenv(rankenv.ErrorFile), err)
		}
	}()
	spec, env, closeEnv, err := o.setup(ctx)
	if err != nil {
		return err
	}
	defer closeEnv()
	// Injected faults fire on the job's first attempt only, whatever
	// it resumes from.
	failAt, err := faultStep(o.Getenv, dist.RestartCount(o.Getenv) > 0)
	if err != nil {
		return err
	}
	env.StopAfter = failAt
	endDumps := o.armDumps(env)
	res, err := Run(ctx, spec, env)
	endDumps(err)
	if err != nil {
		return err
	}
	if res.Preempted {
		return o.stopped(ctx, res, spec.Checkpoint.Dir)
	}
	if failAt > 0 && res.Steps == failAt && failAt < spec.Steps {
		return fmt.Errorf("worker: %s=%d: failing after step %d on purpose (fault injection for tests)", rankenv.FaultFailAfterStep, failAt, failAt)
	}
	switch {
	case res.Checkpoint == "" || env.Rank != 0 || o.Log == nil:
	case res.Steps < spec.Steps:
		fmt.Fprintf(o.Log, "saved %s; continue with: gtrain resume %s\n", res.Checkpoint, spec.Checkpoint.Dir)
	default:
		fmt.Fprintf(o.Log, "saved %s; export the weights with: gtrain ckpt export %s --out model.safetensors\n", res.Checkpoint, spec.Checkpoint.Dir)
	}
	return nil
}

// setup reads the rank's job and joins the others. Until the trainer runs
// there is nothing to save: both stop at the first preemption signal. The
// returned func closes the rank's links and status pipe.
func (o RankOptions) setup(ctx context.Context) (Spec, Env, func(), error) {
	setup, endSetup := o.untilPreempted(ctx)
	defer endSetup()
	spec, err := o.spec(setup)
	if err != nil {
		return spec, Env{}, nil, err
	}
	env, closeEnv, err := envFromEnviron(setup, o.Getenv)
	if err != nil {
		return spec, env, nil, err
	}
	env.Resume, env.ResumeFrom = o.Resume, o.ResumeFrom
	env.RunID = o.Getenv(rankenv.RunID)
	// A restart of the job continues from the newest checkpoint this job
	// wrote, rather than refusing its own directory (or, resumed from a
	// step directory, setting its own newer ones aside).
	env.Restart = o.ResumeIfAny || dist.RestartCount(o.Getenv) > 0
	env.Preempt, env.Log, env.Warn = o.Preempt, o.Log, o.Warn
	return spec, env, closeEnv, nil
}

// spec is the launcher's resolved spec, else LoadJob's, resolved here.
func (o RankOptions) spec(ctx context.Context) (Spec, error) {
	js := o.Getenv(rankenv.JobSpec)
	if js == "" {
		return o.loadJob(ctx)
	}
	if o.JobFlags {
		return Spec{}, usage.Errorf("worker: %s is set by the launcher; --job and --set cannot change it", rankenv.JobSpec)
	}
	var spec Spec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		return spec, fmt.Errorf("worker: %s: %w", rankenv.JobSpec, err)
	}
	return spec, nil
}

// loadJob is LoadJob's job resolved for a rank started alone: with a new
// runs/<time> in the working directory when it names no checkpoint.dir.
func (o RankOptions) loadJob(ctx context.Context) (Spec, error) {
	spec, err := o.LoadJob(ctx)
	if err != nil {
		return spec, err
	}
	dir, err := os.Getwd()
	if err != nil {
		return spec, fmt.Errorf("worker: %w", err)
	}
	spec, _, err = ResolveIn(spec, dir, nil)
	return spec, err
}

// envFromEnviron reads the rank's place in the job from the environment
// the launcher wrote (the reverse of launch's Job.environFor). Started by
// the launcher with more than one rank, it joins the others through the
// job's store (engine/dist) and gets the data-parallel communicator; alone
// (no WORLD_SIZE, or 1) it is a single rank. It also opens the agent's
// status pipe. The returned func closes both.
func envFromEnviron(ctx context.Context, getenv func(string) string) (Env, func(), error) {
	env := Env{World: 1, LocalWorld: 1}
	env.CPUs, _ = strconv.Atoi(getenv(rankenv.CPUs)) // set by the agent under --bind; else 0
	status, err := dist.StatusFile(getenv)
	if err != nil {
		return env, nil, fmt.Errorf("worker: %w", err)
	}
	closeStatus := func() {}
	if status != nil {
		env.Status = status // not a nil *os.File in a non-nil io.Writer
		closeStatus = func() { status.Close() }
	}
	if dist.Alone(getenv) {
		return env, closeStatus, nil
	}
	de, err := dist.FromEnv(getenv)
	if err != nil {
		closeStatus()
		return env, nil, fmt.Errorf("worker: %w", err)
	}
	w, err := dist.Init(ctx, de, dist.Options{Comm: comm.Options{Name: "dp"}})
	if err != nil {
		closeStatus()
		return env, nil, fmt.Errorf("worker: %w", err)
	}
	env.Rank, env.World, env.LocalWorld, env.Comm = de.Rank, de.WorldSize, de.LocalWorldSize, w.Comm
	env.Host = de.Host
	return env, func() { w.Close(); closeStatus() }, nil
}

// faultStep is the step rankenv.FaultFailAfterStep asks the first attempt
// of a job to fail after, or 0: a fault injection that lets the tests of
// --max-restarts fail a real rank at a known point, after its checkpoints
// up to there.
func faultStep(getenv func(string) string, restart bool) (int, error) {
	v := getenv(rankenv.FaultFailAfterStep)
	if v == "" || restart {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, usage.Errorf("worker: %s=%q: want a step number ≥ 1", rankenv.FaultFailAfterStep, v)
	}
	return n, nil
}
