package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/optim"
	"github.com/gtrain/gtrain/engine/zero"
)

// rankState is the run's position, saved beside each rank's tensors (the
// same on every rank: the sampler's stream is global).
type rankState struct {
	Step     int               `json:"step"`      // steps completed
	AdamStep int               `json:"adam_step"` // optimizer steps taken (bias correction)
	Sampler  data.SamplerState `json:"sampler"`
	Scaler   *zero.ScalerState `json:"loss_scaler,omitempty"` // fp16
}

// NewestValid is the newest valid checkpoint in dir, if any. Like Latest it
// verifies from the newest down and stops at the first valid one; it gives
// up (false) when ctx ends, which the caller checks.
func NewestValid(ctx context.Context, dir string) (*ckpt.Checkpoint, bool) {
	c, err := ckpt.Latest(ctx, dir, nil)
	return c, err == nil
}

// prepareCheckpoints makes the checkpoint directory this run's and
// restores the checkpoint to start from. Rank 0 takes the directory's
// writer lock (held until release) and checks that it can write there, so
// that a directory in use or unwritable fails the run before its first
// step rather than at its first checkpoint; with ranks on several hosts,
// that every rank's files reach rank 0 (probeShared). Then: a restart resumes from
// the newest valid checkpoint, if any; a resume from the one asked for, or
// the newest; a fresh run refuses a directory that holds another run's
// checkpoints.
func (t *Trainer) prepareCheckpoints(res *Result) (release func(), err error) {
	dir := t.spec.Checkpoint.Dir
	if dir == "" {
		return func() {}, nil
	}
	lock, err := t.lockDir()
	release = func() {
		t.abandonSaves() // a run that ends early leaves no goroutine writing
		if err := lock.Unlock(); err != nil {
			t.env.Warn(fmt.Sprintf("train: unlock %s: %v", dir, err))
		}
	}
	if err = t.agree(err, "could not use checkpoint.dir "+dir); err != nil {
		release()
		return nil, err
	}
	if err = t.probeShared(); err != nil {
		release()
		return nil, err
	}
	if t.spec.Checkpoint.Async {
		t.async = &asyncSave{}
	}
	c, err := t.startingPoint()
	if err == nil && c != nil {
		err = t.resumeFrom(c, res)
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// lockDir is rank 0's part of prepareCheckpoints: it creates the checkpoint
// directory, takes its writer lock and checks that it is writable. Other
// ranks hold no lock (nil).
func (t *Trainer) lockDir() (*ckpt.DirLock, error) {
	if t.env.Rank != 0 {
		return nil, nil
	}
	dir := t.spec.Checkpoint.Dir
	lock, err := ckpt.LockWriter(dir, ckpt.ThisProcess(t.env.RunID, ""))
	if err == nil {
		if err = ckpt.CheckWritable(dir); err != nil {
			lock.Unlock()
		}
	}
	switch {
	case err == nil:
		return lock, nil
	case errors.As(err, new(*ckpt.LockedError)):
		return nil, fmt.Errorf("train: checkpoint.dir: %w", err)
	}
	return nil, fmt.Errorf("train: checkpoint.dir: %w; set checkpoint.dir to a directory this user can create and write to", err)
}

// startingPoint is the checkpoint the run starts from, nil for a fresh
// start. Verifying a checkpoint reads all of it: it stops when the run's
// context ends.
func (t *Trainer) startingPoint() (*ckpt.Checkpoint, error) {
	ctx, dir, env := t.ctx(), t.spec.Checkpoint.Dir, t.env
	switch {
	case env.Restart:
		// A restart (or a per-node job its scheduler may have started again:
		// --resume-if-any) continues this job: from its newest checkpoint, not from
		// the step the job was resumed from.
		c, err := ckpt.Latest(ctx, dir, env.Warn)
		if errors.Is(err, ckpt.ErrNoCheckpoint) && !env.Resume {
			t.logf("no valid checkpoint in %s yet: starting afresh", dir)
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("train: restart: resume from %s: %w", dir, err)
		}
		return c, nil
	case env.ResumeFrom != "":
		c, err := ckpt.Open(ctx, env.ResumeFrom)
		if err != nil {
			return nil, fmt.Errorf("train: resume from %s: %w", env.ResumeFrom, err)
		}
		return c, nil
	case env.Resume:
		c, err := ckpt.Latest(ctx, dir, env.Warn)
		if err != nil {
			return nil, fmt.Errorf("train: resume from %s: %w", dir, err)
		}
		return c, nil
	}
	err := CheckFresh(ctx, dir)
	switch {
	case errors.As(err, new(*UsedDirError)):
		return nil, fmt.Errorf("train: %w", err)
	case err != nil:
		return nil, fmt.Errorf("train: check checkpoint.dir %s: %w", dir, err)
	}
	return nil, nil
}

// UsedDirError is a new run's checkpoint directory Dir that already holds
// a run's checkpoint, in the step directory Step.
type UsedDirError struct{ Dir, Step string }

func (e *UsedDirError) Error() string {
	return fmt.Sprintf("checkpoint.dir %s already holds %s of a run: continue it with `gtrain resume %s`, or set another checkpoint.dir",
		e.Dir, e.Step, e.Dir)
}

// CheckFresh refuses, with a *UsedDirError, to start a new run in a
// directory that holds another run's checkpoints: continuing it is
// `gtrain resume`, and mixing two runs' steps in one directory loses one of
// them. An absent or empty directory, or one with only unfinished writes,
// is fresh. Verifying a checkpoint reads all of it: CheckFresh returns
// context.Cause(ctx) when ctx ends first. The launcher checks before any
// rank starts, and the ranks again before the first step (a hostfile's
// hosts may see another directory).
func CheckFresh(ctx context.Context, dir string) error {
	c, ok := NewestValid(ctx, dir)
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case ok:
		return &UsedDirError{Dir: dir, Step: filepath.Base(c.Dir)}
	}
	return nil
}

// resumeFrom loads c. Resumed from an older checkpoint than the newest
// (asked for explicitly), rank 0 first sets the newer step directories
// aside: this run's steps must not mix with those of the history it
// abandons.
func (t *Trainer) resumeFrom(c *ckpt.Checkpoint, res *Result) error {
	if t.env.ResumeFrom != "" && !t.env.Restart {
		var err error
		if t.env.Rank == 0 {
			err = t.setAside(c)
		}
		if err = t.agree(err, "could not set newer checkpoints aside"); err != nil {
			return err
		}
	}
	if err := t.load(c); err != nil {
		return err
	}
	res.Resumed = t.step
	how := "resumed"
	if t.env.Restart {
		how = "restart: resumed"
	}
	t.logf("%s from %s at step %d", how, c.Dir, t.step)
	return nil
}

// setAside moves the step directories newer than c out of the way.
func (t *Trainer) setAside(c *ckpt.Checkpoint) error {
	dir := t.spec.Checkpoint.Dir
	dest, moved, err := ckpt.SetAside(dir, c.Step(), time.Now())
	if len(moved) > 0 {
		t.logf("resuming from %s, older than the newest step directory: moved %s to %s",
			filepath.Base(c.Dir), strings.Join(moved, ", "), dest)
	}
	if err != nil {
		return fmt.Errorf("train: resume from %s: %w", c.Dir, err)
	}
	return nil
}

// load restores parameters, optimizer state, step, sampler position and
// loss scale from c, whatever DP size and ZeRO stage wrote it: each rank
// takes its part of every tensor (engine/zero resharding).
func (t *Trainer) load(c *ckpt.Checkpoint) error {
	fail := func(err error) error { return fmt.Errorf("train: load %s: %w", c.Dir, err) }
	if err := t.loadTensors(c); err != nil {
		return fail(err)
	}
	stateBytes, err := c.State(c.Manifest.Files[0].Rank)
	if err != nil {
		return fail(err)
	}
	var st rankState
	if err := json.Unmarshal(stateBytes, &st); err != nil {
		return fail(fmt.Errorf("rank state: %w", err))
	}
	if int64(st.Step) != c.Manifest.Step {
		return fail(fmt.Errorf("rank state says step %d, manifest step %d", st.Step, c.Manifest.Step))
	}
	if err := t.sampler.Restore(st.Sampler); err != nil {
		return fail(err)
	}
	if st.Scaler != nil {
		t.scaler().RestoreScaler(*st.Scaler)
	}
	t.step, t.adam().Step = st.Step, st.AdamStep
	p := t.spec.Parallel
	l := c.Manifest.Layout
	l.TP, l.PP = max(l.TP, 1), max(l.PP, 1)
	switch {
	case l.TP != p.TP || l.PP != p.PP:
		t.logf("resharded: checkpoint of tp %d × pp %d × dp %d at ZeRO stage %d, resumed on tp %d × pp %d × dp %d at stage %d",
			l.TP, l.PP, l.DP, l.ZeroStage, p.TP, p.PP, p.DP, p.ZeroStage)
	case l.World != t.env.World || l.ZeroStage != p.ZeroStage:
		t.logf("resharded: checkpoint of %d ranks at ZeRO stage %d, resumed on %d at stage %d", l.World, l.ZeroStage, t.env.World, p.ZeroStage)
	}
	return nil
}

// loadTensors restores the parameters and the optimizer's moments from c,
// whatever layout wrote it.
func (t *Trainer) loadTensors(c *ckpt.Checkpoint) error {
	if t.grid != nil {
		return t.grid.load(c)
	}
	err := t.zero.Load(c)
	if n := t.zero.CompressionNote(); err == nil && n != "" {
		t.logf("%s", n)
	}
	return err
}

// adam is the rank's AdamW state.
func (t *Trainer) adam() *optim.AdamW {
	if t.grid != nil {
		return t.grid.opt.Optimizer()
	}
	return t.zero.Optimizer()
}

// checkpointDue says whether the step just completed is saved: every
// Checkpoint.Every steps and at the last step.
func (t *Trainer) checkpointDue() bool {
	c := t.spec.Checkpoint
	return c.Dir != "" && (t.step == t.spec.Steps || (c.Every > 0 && t.step%c.Every == 0))
}

// SaveCheckpoint writes this rank's part of the state for the current
// step; rank 0 commits the checkpoint once every rank's file is written.
// Every rank must call it. It returns the step directory. It writes at
// once, whatever checkpoint.async says.
func (t *Trainer) SaveCheckpoint() (string, error) {
	s, err := t.capture()
	if err != nil {
		return "", err
	}
	f, werr := s.write()
	files, err := t.shareFiles(f, werr)
	if err == nil && t.env.Rank == 0 {
		err = t.commit(s.step, files, t.env.Warn)
	}
	return t.agreeSaved(s.step, err)
}

// rankSave is what a rank writes for the checkpoint of one step: its
// state and its tensors, views of the live state (a synchronous save) or
// of a snapshot (checkpoint.async).
type rankSave struct {
	dir   string
	step  int
	rank  int
	state []byte
	shard []ckpt.Tensor     // the data-parallel path
	parts []ckpt.PartTensor // tp·pp > 1
}

// capture is what the rank saves for the current step, its tensors views
// of the live state.
func (t *Trainer) capture() (rankSave, error) {
	st := rankState{Step: t.step, AdamStep: t.adam().Step, Sampler: t.sampler.State()}
	if t.spec.Precision == "fp16" {
		sc := t.scaler().Scaler()
		st.Scaler = &sc
	}
	state, err := json.Marshal(st)
	if err != nil {
		return rankSave{}, fmt.Errorf("train: checkpoint step %d: rank state: %w", t.step, err)
	}
	s := rankSave{dir: t.spec.Checkpoint.Dir, step: t.step, rank: t.env.Rank, state: state}
	if t.grid != nil {
		s.parts = t.grid.parts()
	} else {
		s.shard = t.zero.Shard()
	}
	return s, nil
}

// write writes the rank's file of s (sha256 computed while it is written,
// fsynced, renamed into place). It touches no communicator, so a
// background goroutine may call it.
func (s rankSave) write() (ckpt.File, error) {
	if s.parts != nil {
		return ckpt.WriteParts(s.dir, int64(s.step), s.rank, s.parts, s.state)
	}
	return ckpt.WriteShard(s.dir, int64(s.step), s.rank, s.shard, s.state)
}

// commit is rank 0's commit of step, once every rank's file is written
// (files): the manifest, written last and atomically, then pruning
// beyond checkpoint.keep. It touches no communicator.
func (t *Trainer) commit(step int, files []ckpt.File, warn func(string)) error {
	p := t.spec.Parallel
	man := ckpt.Manifest{
		Step: int64(step), Job: t.marshalSpec(), Files: files,
		Layout: ckpt.Layout{World: t.env.World, DP: p.DP, TP: p.TP, PP: p.PP, ZeroStage: p.ZeroStage},
	}
	// The metrics up to step are durable before the checkpoint exists: a
	// resume from it cuts the file back to step and must find them.
	if err := t.metrics.sync(); err != nil {
		return err
	}
	return ckpt.Commit(t.spec.Checkpoint.Dir, man, t.spec.Checkpoint.Keep, warn)
}

// agreeSaved makes rank 0's outcome of the commit of step (err on rank 0;
// on the others, their own error so far) every rank's, and returns the
// step directory.
func (t *Trainer) agreeSaved(step int, err error) (string, error) {
	if err = t.agree(err, "could not commit the checkpoint"); err != nil {
		return "", fmt.Errorf("train: checkpoint step %d: %w", step, err)
	}
	return filepath.Join(t.spec.Checkpoint.Dir, ckpt.StepDirName(int64(step))), nil
}
