package train

import (
	"encoding/json"
	"fmt"
	"time"
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
	StepMillis float64   `json:"step_ms"`
	TokensPerS float64   `json:"tokens_per_s"`
	Memory     MemoryUse `json:"memory"`
}

// MemoryUse is the bytes a rank holds, by category.
type MemoryUse struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	Total       int64 `json:"total"`
}

func (t *Trainer) memory() MemoryUse {
	m := t.model.Memory()
	u := MemoryUse{Params: m.Params, Grads: m.Grads, Optimizer: int64(len(t.opt.M)+len(t.opt.V)) * 4, Activations: m.Activations}
	u.Total = u.Params + u.Grads + u.Optimizer + u.Activations
	return u
}

func (t *Trainer) record(loss float32, norm, lr float64, elapsed time.Duration, tokens int) Record {
	return Record{
		Step: t.step, Steps: t.spec.Steps, Loss: loss, LR: lr, GradNorm: norm,
		StepMillis: float64(elapsed.Microseconds()) / 1000,
		TokensPerS: float64(tokens) / elapsed.Seconds(),
		Memory:     t.memory(),
	}
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
	t.logf("step %*d/%d | loss %.4f%s | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s",
		len(fmt.Sprint(r.Steps)), r.Step, r.Steps, r.Loss, val, r.LR, r.GradNorm, r.StepMillis, r.TokensPerS)
}
