package train

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/data"
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
// verifies from the newest down and stops at the first valid one.
func NewestValid(dir string) (*ckpt.Checkpoint, bool) {
	c, err := ckpt.Latest(dir, nil)
	return c, err == nil
}

// prepareCheckpoints restores the newest valid checkpoint when resuming, and
// otherwise refuses a directory that holds another run's checkpoints.
func (t *Trainer) prepareCheckpoints(res *Result) error {
	dir := t.spec.Checkpoint.Dir
	if dir == "" {
		return nil
	}
	if !t.env.Resume {
		if c, ok := NewestValid(dir); ok {
			return fmt.Errorf("train: checkpoint.dir %s already holds %s of a run: continue it with `gtrain resume %s`, or set another checkpoint.dir",
				dir, filepath.Base(c.Dir), dir)
		}
		return nil
	}
	c, err := ckpt.Latest(dir, t.env.Warn)
	if err != nil {
		return fmt.Errorf("train: resume from %s: %w", dir, err)
	}
	if err := t.load(c); err != nil {
		return err
	}
	res.Resumed = t.step
	t.logf("resumed from %s at step %d", c.Dir, t.step)
	return nil
}

// load restores parameters, optimizer state, step, sampler position and
// loss scale from c, whatever DP size and ZeRO stage wrote it: each rank
// takes its part of every tensor (engine/zero resharding).
func (t *Trainer) load(c *ckpt.Checkpoint) error {
	fail := func(err error) error { return fmt.Errorf("train: load %s: %w", c.Dir, err) }
	if err := t.zero.Load(c); err != nil {
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
		t.zero.RestoreScaler(*st.Scaler)
	}
	t.step, t.zero.Optimizer().Step = st.Step, st.AdamStep
	if l := c.Manifest.Layout; l.World != t.env.World || l.ZeroStage != t.spec.Parallel.ZeroStage {
		t.logf("resharded: checkpoint of %d ranks at ZeRO stage %d, resumed on %d at stage %d", l.World, l.ZeroStage, t.env.World, t.spec.Parallel.ZeroStage)
	}
	return nil
}

// checkpointDue says whether the step just completed is saved: every
// Checkpoint.Every steps and at the last step.
func (t *Trainer) checkpointDue() bool {
	c := t.spec.Checkpoint
	return c.Dir != "" && (t.step == t.spec.Steps || (c.Every > 0 && t.step%c.Every == 0))
}

// SaveCheckpoint writes this rank's part of the state for the current
// step; rank 0 commits the checkpoint once every rank's file is written.
// Every rank must call it. It returns the step directory.
func (t *Trainer) SaveCheckpoint() (string, error) {
	dir := t.spec.Checkpoint.Dir
	st := rankState{Step: t.step, AdamStep: t.zero.Optimizer().Step, Sampler: t.sampler.State()}
	if t.spec.Precision == "fp16" {
		sc := t.zero.Scaler()
		st.Scaler = &sc
	}
	state, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	f, werr := ckpt.WriteShard(dir, int64(t.step), t.env.Rank, t.zero.Shard(), state)
	files, err := t.shareFiles(f, werr)
	if err == nil && t.env.Rank == 0 {
		p := t.spec.Parallel
		man := ckpt.Manifest{
			Step: int64(t.step), Job: t.marshalSpec(), Files: files,
			Layout: ckpt.Layout{World: t.env.World, DP: p.DP, TP: p.TP, PP: p.PP, ZeroStage: p.ZeroStage},
		}
		err = ckpt.Commit(dir, man, t.spec.Checkpoint.Keep, t.env.Warn)
	}
	if err = t.agree(err); err != nil {
		return "", fmt.Errorf("train: checkpoint step %d: %w", t.step, err)
	}
	return filepath.Join(dir, ckpt.StepDirName(int64(t.step))), nil
}
