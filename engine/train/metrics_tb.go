package train

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gtrain/gtrain/internal/tfevents"
)

// TensorBoard tags of a step's scalars, those a PyTorch SummaryWriter user
// picks for a language model (nanoGPT's wandb keys, with TensorBoard's
// slash grouping).
const (
	TagLoss       = "train/loss"
	TagValLoss    = "val/loss"
	TagLR         = "lr"
	TagGradNorm   = "grad_norm"
	TagTokensPerS = "tokens_per_s"
	TagStepMillis = "step_ms"
	TagMemory     = "memory/total_bytes"
	TagLossScale  = "loss_scale"
	// TagJob is the text summary of the resolved job, at the run's first
	// step.
	TagJob = "job/text_summary"
)

// tbSink writes rank 0's metrics to TensorBoard (log.tensorboard).
type tbSink struct{ w *tfevents.Writer }

// openTensorBoard opens a new event file in log.tensorboard, if set, with
// the job as text; a resumed run first marks its step as a restart.
func (t *Trainer) openTensorBoard() error {
	dir := t.spec.Log.TensorBoard
	if dir == "" {
		return nil
	}
	now := time.Now()
	w, err := tfevents.Create(dir, now)
	if err != nil {
		return fmt.Errorf("train: log.tensorboard %s: %w; set log.tensorboard to a directory this user can write", dir, err)
	}
	wall := unixSeconds(now)
	if t.step > 0 {
		// The first step taken again: TensorBoard keeps the older events
		// of the steps before it.
		err = w.Restart(int64(t.step+1), wall)
	}
	if err == nil {
		err = w.Text(int64(t.step), wall, TagJob, jobText(t.spec))
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		w.Close()
		return fmt.Errorf("train: log.tensorboard %s: %w", dir, err)
	}
	t.metrics.tb = tbSink{w}
	return nil
}

// jobText is the job as TensorBoard's text plugin shows it: indented JSON
// in a Markdown code block.
func jobText(spec Spec) string {
	b, _ := json.MarshalIndent(spec, "", "  ")
	return "```json\n" + string(b) + "\n```"
}

// Scalars is a step's TensorBoard scalars: those of m that are set.
func Scalars(m MetricsLine) []tfevents.Scalar {
	s := []tfevents.Scalar{
		{Tag: TagLoss, Value: m.Loss},
		{Tag: TagLR, Value: float32(m.LR)},
		{Tag: TagGradNorm, Value: float32(m.GradNorm)},
		{Tag: TagTokensPerS, Value: float32(m.TokensPerS)},
		{Tag: TagStepMillis, Value: float32(m.StepMillis)},
		{Tag: TagMemory, Value: float32(m.Memory.Total)},
	}
	if m.ValLoss != nil {
		s = append(s, tfevents.Scalar{Tag: TagValLoss, Value: *m.ValLoss})
	}
	if m.LossScale != 0 {
		s = append(s, tfevents.Scalar{Tag: TagLossScale, Value: float32(m.LossScale)})
	}
	return s
}

func (s tbSink) add(m MetricsLine) error {
	if err := s.w.Scalars(int64(m.Step), m.Time, Scalars(m)); err != nil {
		return err
	}
	return s.w.Flush()
}

func (s tbSink) flush() error { return s.w.Sync() }
func (s tbSink) close() error { return s.w.Close() }
