// Package enginejob prepares a job of the built-in engine on the
// launcher's side, before any rank starts: it reads the job (a job file
// with --set, or the job saved in the checkpoint a resume starts from),
// resolves it with its checkpoint directory (a new run directory by
// default), makes the launcher the directory's one writer for the job's
// life (ckpt.Lock), refuses a fresh run into a directory that holds a run
// and a job that cannot fit in this machine's memory, and says what every
// rank runs: `gtrain worker` with the resolved spec in its environment.
//
// It is the launcher's part of the engine, so it lives outside engine/*
// (which must not import the launcher or viper); the ranks' part is
// engine/train. cmd/gtrain turns a Job's command and environment into the
// launch options of the job.
package enginejob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/jobfile"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// Options say how a job of the engine is to run, as far as its preparation
// cares: cmd/gtrain fills them from the command line.
type Options struct {
	Job  string   // Fresh: the YAML job file; "" is the built-in default job
	Sets []string // key=value settings over the job (--set)
	// Layout, when not nil, lays out a fresh job once it is read (run
	// --auto).
	Layout func(context.Context, train.Spec) (train.Spec, error)

	Dir string // the ranks' working directory, which relative checkpoint directories are in
	// Hostfile says that the ranks run on a hostfile's hosts, which may
	// not see this machine's directories nor have its memory: nothing is
	// claimed or created here, and no memory checked (rank 0 does both).
	Hostfile bool
	// PerNode says that the job is one node's part of a per-node job
	// (gtrain run --node-rank): as with Hostfile nothing is claimed here,
	// and its run directory is runs/<RunID>, which every node names alike.
	PerNode bool
	DryRun  bool // create and claim nothing
	Ranks   int  // ranks on this machine (--nproc-per-node)
	// RanksGiven is whether Ranks was given; if not, a resume on this
	// machine runs as many ranks as wrote its checkpoint.
	RanksGiven bool
	RunID      string           // the job's id (--rdzv-id); "" is a fresh one, made when the lock needs it
	Args       []string         // the launcher's command line (os.Args), recorded in the lock without --env values
	Warn       func(msg string) // warnings: a checkpoint skipped, a lock not released; nil drops them
}

func (o Options) warn(msg string) {
	if o.Warn != nil {
		o.Warn(msg)
	}
}

// Job is a prepared job of the engine: what its ranks run, and the
// launcher's hold on the checkpoint directory, kept until Release.
type Job struct {
	Spec    train.Spec // resolved, with an absolute checkpoint.dir
	Command []string   // every rank's command: gtrain worker, with the flags of a resume
	Env     []string   // KEY=VALUE added to every rank's environment: rankenv.JobSpec
	RunID   string     // the job id the lock names; "" when no lock was taken
	Ranks   int        // ranks on this machine, without a hostfile
	// From is the checkpoint a resume starts from; nil for a fresh job.
	From  *ckpt.Checkpoint
	claim *claim
	// perNodeID is a per-node job's --rdzv-id, which its checkpoint
	// directory's record names (pernode.go).
	perNodeID string
}

// Release gives up the checkpoint directory, removing it if the launcher
// created it and no checkpoint was written (a job that failed before its
// first checkpoint leaves nothing behind). Call it when the job has ended.
func (j *Job) Release() { j.claim.release() }

// Fresh prepares a new job: o.Job with o.Sets over the built-in default
// (jobfile.Load), laid out by o.Layout. Its checkpoint directory is the
// job's, else a new runs/<start time> in o.Dir, created now (on a
// hostfile's hosts rank 0 creates it; a dry run names the one it would
// create). The directory must hold no run yet (train.CheckFresh), and the
// ranks must fit in this machine's memory (train.CheckMemory).
func Fresh(ctx context.Context, o Options) (*Job, error) {
	o.Hostfile = o.Hostfile || o.PerNode // the other nodes' ranks check on their hosts
	spec, err := jobfile.Load(ctx, o.Job, o.Sets)
	if err == nil && o.Layout != nil {
		spec, err = o.Layout(ctx, spec)
	}
	if err != nil {
		return nil, err
	}
	created := ""
	spec, js, err := train.ResolveIn(spec, o.Dir, o.newRunDir(time.Now(), &created))
	if err != nil {
		return nil, err
	}
	j := &Job{Spec: spec, Ranks: o.Ranks}
	if o.PerNode {
		j.perNodeID = o.RunID
	}
	if j.claim, j.RunID, err = claimDir(o, spec.Checkpoint.Dir, created, "set checkpoint.dir to a directory this user can create and write to"); err != nil {
		return nil, err
	}
	if err := j.finish(ctx, o, js); err != nil {
		j.Release()
		return nil, err
	}
	return j, nil
}

// newRunDir picks a new run's directory in runs: created now for a job on
// this machine (and *created set to the topmost directory made for it),
// only named for a dry run or a hostfile's hosts.
func (o Options) newRunDir(now time.Time, created *string) func(runs string) (string, error) {
	return func(runs string) (string, error) {
		switch {
		case o.PerNode:
			return perNodeRunDir(runs, o.RunID)
		case o.DryRun:
			return train.NextRunDir(runs, now)
		case o.Hostfile:
			return train.RemoteRunDir(runs, now)
		}
		top := missingFrom(runs)
		run, err := train.FreshRunDir(runs, now)
		*created = run
		if top != "" {
			*created = top
		}
		return run, err
	}
}

// finish is the end of a fresh job's preparation, once its directory is
// claimed: the directory must hold no run, the ranks must fit.
func (j *Job) finish(ctx context.Context, o Options, js string) error {
	if err := o.checkLayout(j.Spec, j.Ranks, false); err != nil {
		return err
	}
	err := o.checkFresh(ctx, j.Spec.Checkpoint.Dir)
	if errors.As(err, new(*train.UsedDirError)) {
		return usage.Errorf("run: %w", err)
	}
	if err == nil {
		err = o.checkMemory(j.Spec, j.Ranks)
	}
	if err != nil {
		return err
	}
	j.Command, j.Env = []string{"gtrain", "worker"}, []string{rankenv.JobSpec + "=" + js}
	if o.PerNode {
		// Started again by its scheduler, a per-node job continues
		// (PerNodePlanner checks the directory is its own).
		j.Command = append(j.Command, "--resume-if-any")
	}
	return nil
}

// Resume prepares the continuation of the job whose checkpoints are in
// path (its checkpoint.dir), from its newest valid checkpoint, or from the
// step directory path names: the job saved in that checkpoint, o.Sets over
// it. The directory is claimed before it is read, so a job still writing
// to it refuses the resume, naming itself, before anything else is said.
// Without a hostfile and o.RanksGiven it runs as many ranks as wrote the
// checkpoint.
func Resume(ctx context.Context, path string, o Options) (*Job, error) {
	t, err := ckpt.ResolveArg("resume", path)
	if err != nil {
		return nil, err
	}
	if t, err = absTarget(t); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	j := &Job{}
	if j.claim, j.RunID, err = claimDir(o, t.Root, "", "copy the directory to one this user can write to and resume the copy"); err != nil {
		return nil, err
	}
	if err := j.resume(ctx, o, path, t); err != nil {
		j.Release()
		return nil, err
	}
	return j, nil
}

// resume is Resume once the directory is claimed.
func (j *Job) resume(ctx context.Context, o Options, path string, t ckpt.Target) error {
	c, err := resumePoint(ctx, o.warn, path, t)
	if err != nil {
		return inUse(ctx, err, o, t.Root)
	}
	var spec train.Spec
	if err := json.Unmarshal(c.Manifest.Job, &spec); err != nil {
		return fmt.Errorf("resume: %s: job spec in manifest: %w", c.Dir, err)
	}
	if len(o.Sets) > 0 {
		if spec, err = jobfile.Overlay(spec, o.Sets); err != nil {
			return err
		}
	}
	spec.Checkpoint.Dir = t.Root // the directory may have moved since
	if j.Ranks, err = resumeRanks(o, c); err != nil {
		return err
	}
	spec, js, err := train.ResolveIn(spec, t.Root, nil) // checkpoint.dir is set: nothing created
	if err != nil {
		return err
	}
	if err := o.checkLayout(spec, j.Ranks, true); err != nil {
		return err
	}
	if err := o.checkMemory(spec, j.Ranks); err != nil {
		return err
	}
	j.Spec, j.From = spec, c
	j.Command = []string{"gtrain", "worker", "--resume"}
	if t.Step != "" {
		j.Command = append(j.Command, "--resume-from", c.Dir)
	}
	j.Env = []string{rankenv.JobSpec + "=" + js}
	return nil
}

// resumeRanks is the number of ranks a resume runs on this machine: as
// asked, or as many as wrote the checkpoint c.
func resumeRanks(o Options, c *ckpt.Checkpoint) (int, error) {
	world := c.Manifest.Layout.World
	if o.Hostfile || o.RanksGiven || world <= 0 {
		return o.Ranks, nil
	}
	if world > hostfiles.MaxSlotsPerHost {
		return 0, usage.Errorf("resume: %s was written by %d ranks, more than the %d one machine runs: give --hostfile, or --nproc-per-node to resume on fewer ranks",
			c.Dir, world, hostfiles.MaxSlotsPerHost)
	}
	return world, nil
}

// checkMemory refuses a local job of the engine whose ranks cannot fit in
// this machine's memory, before any rank starts (train.CheckMemory; a
// *train.MemoryError is a usage error). The ranks of a hostfile job check
// on their own hosts. A dry run checks too: it shows what the run would
// do, and the run would refuse.
func (o Options) checkMemory(spec train.Spec, ranks int) error {
	if o.Hostfile {
		return nil
	}
	return train.CheckMemory(spec, ranks)
}

// checkLayout refuses a local job whose parallel layout (tp × pp × dp)
// does not fit its ranks, before any starts (train.CheckLayout). A
// hostfile job's rank count is the hostfile's: its ranks check.
func (o Options) checkLayout(spec train.Spec, ranks int, resume bool) error {
	if o.Hostfile {
		return nil
	}
	return train.CheckLayout(spec, ranks, resume)
}

// absTarget makes both paths of t absolute: the ranks may run elsewhere.
func absTarget(t ckpt.Target) (ckpt.Target, error) {
	var err error
	if t.Root, err = filepath.Abs(t.Root); err != nil || t.Step == "" {
		return t, err
	}
	t.Step, err = filepath.Abs(t.Step)
	return t, err
}

// inUse adds to a dry run's failure to read a checkpoint of root that
// another job holds the directory (a real resume has been refused by then,
// naming that job): that job commits and prunes checkpoints as it trains,
// and one may have changed while it was read.
func inUse(ctx context.Context, err error, o Options, root string) error {
	if !o.DryRun || ctx.Err() != nil {
		return err
	}
	owner, held := ckpt.Holder(root)
	if !held {
		return err
	}
	return fmt.Errorf("%w; the directory is in use by %s, which commits and prunes checkpoints as it trains: it may not have committed one yet, or pruned one while this dry run read it; run the dry run again", err, owner.Describe())
}

// resumePoint is the checkpoint a resume of path starts from: that of the
// step directory path names, or the newest valid one of the root path.
// Verifying it reads all of it: it stops, with ctx's cause, when ctx ends.
func resumePoint(ctx context.Context, warn func(string), path string, t ckpt.Target) (*ckpt.Checkpoint, error) {
	c, err := t.Load(ctx, warn)
	var inv *ckpt.InvalidError
	switch {
	case err == nil:
		return c, nil
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case errors.Is(err, ckpt.ErrNoCheckpoint):
		return nil, usage.Errorf("resume: %s: no valid checkpoint to resume from (see `gtrain ckpt ls %s`)", path, path)
	case errors.As(err, &inv):
		return nil, usage.Errorf("resume: %s is not a valid checkpoint: %s; resume from %s to take the newest valid one (see `gtrain ckpt ls %s`)",
			path, inv.Problem(), t.Root, t.Root)
	}
	return nil, fmt.Errorf("resume: %w", err)
}
