package train

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/data"
)

// Optimizer-state tensors are named after their parameter, as PyTorch's
// AdamW state_dict calls the moments.
const (
	expAvgPrefix   = ckpt.OptimizerPrefix + "exp_avg."
	expAvgSqPrefix = ckpt.OptimizerPrefix + "exp_avg_sq."
)

// rankState is a rank's position in the run, saved beside its tensors.
type rankState struct {
	Step     int               `json:"step"`      // steps completed
	AdamStep int               `json:"adam_step"` // optimizer steps taken (bias correction)
	Sampler  data.SamplerState `json:"sampler"`
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

// load restores parameters, optimizer moments, step and sampler position
// from this rank's file of c.
func (t *Trainer) load(c *ckpt.Checkpoint) error {
	fail := func(err error) error { return fmt.Errorf("train: load %s: %w", c.Dir, err) }
	if w := c.Manifest.Layout.World; w != max(t.env.World, 1) {
		return fail(fmt.Errorf("written by %d ranks, resumed on %d: resharding arrives with ZeRO (issue 6); resume with %d ranks", w, max(t.env.World, 1), w))
	}
	tensors, stateBytes, err := c.Shard(t.env.Rank)
	if err != nil {
		return fail(err)
	}
	byName := make(map[string]ckpt.Tensor, len(tensors))
	for _, tn := range tensors {
		byName[tn.Name] = tn
	}
	m := t.model
	for _, p := range m.ParamList() {
		for _, dst := range []struct {
			name string
			buf  []float32
		}{{p.Name, m.Params}, {expAvgPrefix + p.Name, t.opt.M}, {expAvgSqPrefix + p.Name, t.opt.V}} {
			tn, ok := byName[dst.name]
			if !ok || tn.Offset != 0 || len(tn.Data) != p.Size() {
				return fail(fmt.Errorf("tensor %s: missing or of another size (is this checkpoint of the same model?)", dst.name))
			}
			copy(dst.buf[p.Offset:p.Offset+p.Size()], tn.Data)
		}
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
	t.step, t.opt.Step = st.Step, st.AdamStep
	return nil
}

// checkpointDue says whether the step just completed is saved: every
// Checkpoint.Every steps and at the last step.
func (t *Trainer) checkpointDue() bool {
	c := t.spec.Checkpoint
	return c.Dir != "" && (t.step == t.spec.Steps || (c.Every > 0 && t.step%c.Every == 0))
}

// SaveCheckpoint writes this rank's tensors and state for the current step
// and, on rank 0, commits the checkpoint. It returns the step directory.
func (t *Trainer) SaveCheckpoint() (string, error) {
	dir, m := t.spec.Checkpoint.Dir, t.model
	tensors := make([]ckpt.Tensor, 0, 3*len(m.ParamList()))
	for _, src := range []struct {
		prefix string
		buf    []float32
	}{{"", m.Params}, {expAvgPrefix, t.opt.M}, {expAvgSqPrefix, t.opt.V}} {
		for _, p := range m.ParamList() {
			tensors = append(tensors, ckpt.Tensor{Name: src.prefix + p.Name, Shape: p.Shape, Data: src.buf[p.Offset : p.Offset+p.Size()]})
		}
	}
	state, err := json.Marshal(rankState{Step: t.step, AdamStep: t.opt.Step, Sampler: t.sampler.State()})
	if err != nil {
		return "", err
	}
	f, err := ckpt.WriteShard(dir, int64(t.step), t.env.Rank, tensors, state)
	if err != nil {
		return "", fmt.Errorf("train: checkpoint step %d: %w", t.step, err)
	}
	p := t.spec.Parallel
	man := ckpt.Manifest{
		Step: int64(t.step), Job: t.marshalSpec(), Files: []ckpt.File{f},
		Layout: ckpt.Layout{World: max(t.env.World, 1), DP: p.DP, TP: p.TP, PP: p.PP, ZeroStage: p.ZeroStage},
	}
	if err := ckpt.Commit(dir, man, t.spec.Checkpoint.Keep, t.env.Warn); err != nil {
		return "", fmt.Errorf("train: checkpoint step %d: %w", t.step, err)
	}
	return filepath.Join(dir, ckpt.StepDirName(int64(t.step))), nil
}
