package train

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gtrain/gtrain/engine/zero"
)

// Record is one step's status record, the JSON object a rank writes to the
// agent's status channel after every step.
type Record struct {
	Step       int       `json:"step"`
	Steps      int       `json:"steps"`
	Loss       float32   `json:"loss"`
	ValLoss    *float32  `json:"val_loss,omitempty"`
	LR         float64   `json:"lr"`
	GradNorm   float64   `json:"grad_norm"`
	LossScale  float64   `json:"loss_scale,omitempty"` // fp16 only
	Skipped    bool      `json:"skipped,omitempty"`    // fp16 overflow: the update was skipped
	StepMillis float64   `json:"step_ms"`
	TokensPerS float64   `json:"tokens_per_s"`
	Memory     MemoryUse `json:"memory"`
}

// MemoryUse is the bytes a rank holds, by category. Params, Grads and
// Optimizer are the model states of the ZeRO paper (Optimizer includes the
// fp32 master weights of mixed precision); Buffers are the gradient
// buckets, gathered layers and conversion scratch.
type MemoryUse struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	Buffers     int64 `json:"buffers"`
	Total       int64 `json:"total"`
}

// Memory is what this rank holds now.
func (t *Trainer) Memory() MemoryUse {
	z := t.zero.Memory()
	u := MemoryUse{Params: z.Params, Grads: z.Grads, Optimizer: z.Optimizer, Activations: t.model.ActivationBytes(), Buffers: z.Buffers}
	u.Total = u.Params + u.Grads + u.Optimizer + u.Activations + u.Buffers
	return u
}

func (t *Trainer) record(loss float32, sr zero.StepResult, lr float64, elapsed time.Duration, tokens int) Record {
	r := Record{
		Step: t.step, Steps: t.spec.Steps, Loss: loss, LR: lr, GradNorm: sr.Norm, Skipped: sr.Skipped,
		StepMillis: float64(elapsed.Microseconds()) / 1000,
		TokensPerS: float64(tokens) / elapsed.Seconds(),
		Memory:     t.Memory(),
	}
	if t.spec.Precision == "fp16" {
		r.LossScale = t.zero.LossScale()
	}
	return r
}

// report writes the status record, and every LogEvery steps (and at the
// first and last) a log line.
func (t *Trainer) report(r Record) {
	if t.env.Status != nil {
		b, _ := json.Marshal(r)
		t.env.Status.Write(append(b, '\n'))
	}
	every := t.spec.LogEvery
	if every == 0 || (r.Step%every != 0 && r.Step != 1 && r.Step != r.Steps && r.ValLoss == nil) {
		return
	}
	val := ""
	if r.ValLoss != nil {
		val = fmt.Sprintf(" | val %.4f", *r.ValLoss)
	}
	if r.Skipped {
		val += fmt.Sprintf(" | overflow: step skipped, loss scale now %g", r.LossScale)
	}
	t.logf("step %*d/%d | loss %.4f%s | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s",
		len(fmt.Sprint(r.Steps)), r.Step, r.Steps, r.Loss, val, r.LR, r.GradNorm, r.StepMillis, r.TokensPerS)
}
