package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
)

// launchEngine runs a fresh job of the built-in engine on spec: its ranks
// are `gtrain worker`, with the resolved spec in their environment. The
// checkpoint directory is claimed first (claimDir).
func (o *RunOptions) launchEngine(ctx context.Context, spec train.Spec) error {
	dir, err := o.workDir()
	if err != nil {
		return err
	}
	now, created := time.Now(), ""
	newRun := func(root string) (string, error) {
		switch {
		case o.DryRun:
			return nextRunDir(root, now)
		case o.Hostfile != "":
			return remoteRunDir(root, now)
		}
		top := missingFrom(root)
		run, err := freshRunDir(root, now)
		created = cmp.Or(top, run)
		return run, err
	}
	spec, js, err := engineJobIn(spec, dir, newRun)
	if err != nil {
		return err
	}
	claim, err := o.claimDir(spec.Checkpoint.Dir, created, "set checkpoint.dir to a directory this user can create and write to")
	if err != nil {
		return err
	}
	defer claim.release(o.IO.Err)
	if err := checkFreshCheckpointDir(ctx, spec.Checkpoint.Dir); err != nil {
		return err
	}
	if err := o.checkEngineMemory(spec); err != nil {
		return err
	}
	o.useEngine(spec, js)
	return o.launch(ctx)
}

// useEngine makes the run's ranks the built-in engine training spec (js
// encoded): `gtrain worker` with args.
func (o *RunOptions) useEngine(spec train.Spec, js string, args ...string) {
	o.Command = append([]string{"gtrain", "worker"}, args...)
	o.Env = append(slices.Clip(o.Env), EnvJobSpec+"="+js)
	c := spec.Model.Config
	fmt.Fprintf(o.IO.Err, "gtrain: built-in engine: GPT-2 %d layers × %d hidden, %d steps; checkpoints in %s\n",
		c.Layers, c.Embd, spec.Steps, spec.Checkpoint.Dir)
}

// checkFreshCheckpointDir refuses to start a new run in a directory that
// holds another run's checkpoints: continuing it is `gtrain resume`, and
// mixing two runs' steps in one directory loses one of them. Verifying a
// checkpoint reads all of it: it stops when ctx ends.
func checkFreshCheckpointDir(ctx context.Context, dir string) error {
	c, ok := train.NewestValid(ctx, dir)
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if !ok {
		return nil // absent, empty or only unfinished writes: start afresh
	}
	return usage.Errorf("run: checkpoint.dir %s already holds %s of a run: continue it with `gtrain resume %s`, or set another checkpoint.dir",
		dir, filepath.Base(c.Dir), dir)
}

// dirClaim is the launcher's hold on a job's checkpoint directory.
type dirClaim struct {
	dir  string
	lock *ckpt.DirLock // nil when not taken (dry run, hostfile)
	// created is the topmost directory the launcher created for dir
	// (dir or an ancestor); "" when dir existed.
	created string
}

// claimDir makes the launcher the one writer of the checkpoint directory
// dir for the whole job, restarts included, before any rank starts: it
// creates dir, takes its lock (ckpt.Lock: another job's gives a
// *ckpt.LockedError naming it) and checks that it can write there. Only
// for a job on this machine alone (no --hostfile): a hostfile's hosts may
// see another directory of that name, or none, and there rank 0 of the
// engine does the same before the first step. A dry run claims nothing.
// created is the directory the caller already created for dir, if any;
// hint says what to do about a directory that cannot be used.
func (o *RunOptions) claimDir(dir, created, hint string) (*dirClaim, error) {
	c := &dirClaim{dir: dir, created: created}
	if o.DryRun || o.Hostfile != "" {
		return c, nil
	}
	if c.created == "" {
		c.created = missingFrom(dir)
	}
	if o.RunID == "" {
		o.RunID = launch.NewRunID() // the plan's, to be named in the lock
	}
	lock, err := ckpt.Lock(dir, ckpt.ThisProcess(o.RunID, ownerCommand(os.Args)))
	if err == nil {
		c.lock = lock
		err = ckpt.CheckWritable(dir)
	}
	if err != nil {
		c.release(o.IO.Err)
		if errors.As(err, new(*ckpt.LockedError)) {
			return nil, err // says what to do
		}
		return nil, fmt.Errorf("%w; %s", err, hint)
	}
	return c, nil
}

// release gives the lock up. A directory the launcher created and no
// checkpoint was written to is removed first: a job that failed before its
// first checkpoint leaves nothing behind.
func (c *dirClaim) release(warn io.Writer) {
	switch {
	case c.created == "":
	case c.lock == nil:
		removeEmptyUpTo(c.dir, c.created)
	default:
		// Only the holder may remove the lock files.
		if removed, _ := ckpt.RemoveUnused(c.dir); removed {
			removeEmptyUpTo(filepath.Dir(c.dir), c.created)
		}
	}
	if err := c.lock.Unlock(); err != nil {
		fmt.Fprintf(warn, "gtrain: warning: unlock %s: %v\n", c.dir, err)
	}
}

// missingFrom is the topmost directory of path, path itself or one of its
// ancestors, that does not exist; "" when path exists.
func missingFrom(path string) string {
	top := ""
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return top
		}
		top = p
		if filepath.Dir(p) == p {
			return top
		}
	}
}

// removeEmptyUpTo removes dir and its ancestors up to top, as long as they
// are empty; top must be dir or one of its ancestors.
func removeEmptyUpTo(dir, top string) {
	if dir != top && !strings.HasPrefix(dir, top+string(filepath.Separator)) {
		return
	}
	for p := dir; ; p = filepath.Dir(p) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return
		}
		if p == top || filepath.Dir(p) == p {
			return
		}
	}
}

// ownerCommand is the command line recorded in a lock file, which others
// may read: the values of --env are left out.
func ownerCommand(args []string) string {
	out := []string{"gtrain"}
	hide := func(kv string) string { k, _, _ := strings.Cut(kv, "="); return k + "=…" }
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--env" && i+1 < len(args):
			out = append(out, a, hide(args[i+1]))
			i++
			continue
		case strings.HasPrefix(a, "--env="):
			a = "--env=" + hide(strings.TrimPrefix(a, "--env="))
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// NewCmdResume wires `gtrain resume DIR`: the launch flags of run, and the
// job from the newest valid checkpoint in DIR.
func NewCmdResume(ios *IOStreams, sig *signals) *cobra.Command {
	opts := &RunOptions{IO: ios, Signals: sig}
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
	addLaunchFlags(f, opts)
	addOutputFlag(f, &opts.Output, "events (or the --dry-run job) as JSON lines on stdout")
	f.StringVar(&opts.Table, "table", "auto", "live status table on stderr: auto (when a terminal), always, never")
	f.BoolVar(&opts.DryRun, "dry-run", false, "resolve the checkpoint, hosts and environments, print the plan, start nothing")
	f.StringArrayVar(&opts.Sets, "set", nil, "override a key of the checkpoint's job, e.g. --set steps=2000 (repeatable)")
	addRestartFlag(f, opts)
	return cmd
}

func resumeRun(ctx context.Context, o *RunOptions, path string, nprocSet bool) error {
	target, err := resolveCkpt("resume", path)
	if err != nil {
		return err
	}
	if target, err = absTarget(target); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	// Claimed before it is read: a job still writing to it refuses the
	// resume, naming itself, before anything else is said.
	claim, err := o.claimDir(target.Root, "", "copy the directory to one this user can write to and resume the copy")
	if err != nil {
		return err
	}
	defer claim.release(o.IO.Err)
	c, err := resumePoint(ctx, o.IO.Err, path, target)
	if err != nil {
		return err
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
	spec.Checkpoint.Dir = target.Root // the directory may have moved since
	if o.Hostfile == "" && !nprocSet && c.Manifest.Layout.World > 0 {
		o.NprocPerNode = c.Manifest.Layout.World
	}
	o.Command = nil
	if err := o.check(); err != nil {
		return err
	}
	spec, js, err := engineJob(spec, target.Root, time.Now()) // checkpoint.dir is set: nothing created
	if err != nil {
		return err
	}
	args := []string{"--resume"}
	if target.Step != "" {
		args = append(args, "--resume-from", c.Dir)
	}
	if err := o.checkEngineMemory(spec); err != nil {
		return err
	}
	fmt.Fprintf(o.IO.Err, "gtrain: resuming from %s (step %d)\n", c.Dir, c.Manifest.Step)
	o.useEngine(spec, js, args...)
	return o.launch(ctx)
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

// resumePoint is the checkpoint a resume of path starts from: that of the
// step directory path names, or the newest valid one of the root path.
// Verifying it reads all of it: it stops, with ctx's cause, when ctx ends.
func resumePoint(ctx context.Context, stderr io.Writer, path string, t ckpt.Target) (*ckpt.Checkpoint, error) {
	c, err := t.Load(ctx, func(msg string) { fmt.Fprintf(stderr, "gtrain: warning: %s\n", msg) })
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
