package train

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/planner"
)

// Record is one step's status record, the JSON object a rank writes to the
// agent's status channel after every step.
//
// JSON has no NaN or infinity, so a value that is not finite is written as
// a string, as protobuf's JSON mapping writes them: "NaN", "Infinity" or
// "-Infinity", and the record says "non_finite": true. Readers that parse a
// number with float() (Python) or Number() (JavaScript) accept both forms.
type Record struct {
	Step       int      `json:"step"`
	Steps      int      `json:"steps"`
	Loss       float32  `json:"loss"`
	ValLoss    *float32 `json:"val_loss,omitempty"`
	LR         float64  `json:"lr"`
	GradNorm   float64  `json:"grad_norm"`
	LossScale  float64  `json:"loss_scale,omitempty"` // fp16 only
	Skipped    bool     `json:"skipped,omitempty"`    // fp16 overflow: the update was skipped
	NonFinite  bool     `json:"non_finite,omitempty"` // a value above is NaN or infinite (written as a string)
	StepMillis float64  `json:"step_ms"`
	// WaitMillis is the part of StepMillis this rank spent blocked in
	// collectives (comm.BlockedTime) during the step: the evaluation,
	// checkpoint and log gather after it are no step's. Every rank of a
	// synchronous job takes as long per step, so the launcher finds a
	// straggler by its own work, StepMillis less WaitMillis: the others
	// wait for it.
	WaitMillis float64   `json:"comm_wait_ms"`
	TokensPerS float64   `json:"tokens_per_s"`
	Memory     MemoryUse `json:"memory"`
	// Coord is the rank's place in a tensor- and pipeline-parallel layout
	// (tp·pp > 1; absent otherwise, where it is dp = the rank).
	Coord *planner.Coord `json:"coord,omitempty"`
}

// recordJSON is Record with the values that can stop being finite as
// jsonFloats; its fields shadow Record's of the same name.
type recordJSON struct {
	plainRecord
	Loss       jsonFloat32  `json:"loss"`
	ValLoss    *jsonFloat32 `json:"val_loss,omitempty"`
	GradNorm   jsonFloat    `json:"grad_norm"`
	StepMillis jsonFloat    `json:"step_ms"`
	TokensPerS jsonFloat    `json:"tokens_per_s"`
}

type plainRecord Record // Record without its methods

// MarshalJSON writes r, with non-finite values as strings (see Record).
func (r Record) MarshalJSON() ([]byte, error) {
	w := recordJSON{plainRecord: plainRecord(r), Loss: jsonFloat32(r.Loss), GradNorm: jsonFloat(r.GradNorm),
		StepMillis: jsonFloat(r.StepMillis), TokensPerS: jsonFloat(r.TokensPerS)}
	if r.ValLoss != nil {
		v := jsonFloat32(*r.ValLoss)
		w.ValLoss = &v
	}
	w.NonFinite = !r.finite()
	return json.Marshal(w)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Record) UnmarshalJSON(b []byte) error {
	var w recordJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Record(w.plainRecord)
	r.Loss, r.GradNorm = float32(w.Loss), float64(w.GradNorm)
	r.StepMillis, r.TokensPerS = float64(w.StepMillis), float64(w.TokensPerS)
	if w.ValLoss != nil {
		v := float32(*w.ValLoss)
		r.ValLoss = &v
	}
	return nil
}

// jsonFloat is a float64 that encoding/json can write when it is not
// finite: as the strings "NaN", "Infinity" and "-Infinity".
type jsonFloat float64

// jsonFloat32 is jsonFloat for a float32, written with float32's shortest
// digits as encoding/json writes a float32.
type jsonFloat32 float32

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	if s, ok := nonFiniteName(float64(f)); ok {
		return []byte(s), nil
	}
	return json.Marshal(float64(f))
}

func (f jsonFloat32) MarshalJSON() ([]byte, error) {
	if s, ok := nonFiniteName(float64(f)); ok {
		return []byte(s), nil
	}
	return json.Marshal(float32(f))
}

func (f *jsonFloat) UnmarshalJSON(b []byte) error { return unmarshalFloat(b, (*float64)(f)) }

func (f *jsonFloat32) UnmarshalJSON(b []byte) error {
	var v float64
	err := unmarshalFloat(b, &v)
	*f = jsonFloat32(v)
	return err
}

// nonFiniteName is v's JSON string when v is not finite.
func nonFiniteName(v float64) (string, bool) {
	switch {
	case v != v:
		return `"NaN"`, true
	case math.IsInf(v, 1):
		return `"Infinity"`, true
	case math.IsInf(v, -1):
		return `"-Infinity"`, true
	}
	return "", false
}

// unmarshalFloat reads a JSON number, or one of nonFiniteName's strings.
func unmarshalFloat(b []byte, v *float64) error {
	var s string
	if json.Unmarshal(b, &s) != nil {
		return json.Unmarshal(b, v)
	}
	switch s {
	case "NaN":
		*v = math.NaN()
	case "Infinity":
		*v = math.Inf(1)
	case "-Infinity":
		*v = math.Inf(-1)
	default:
		return fmt.Errorf("train: status record: %q: want a number, \"NaN\", \"Infinity\" or \"-Infinity\"", s)
	}
	return nil
}

// finite reports whether v is neither NaN nor infinite.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// MemoryUse is the bytes a rank holds, by category. Params, Grads and
// Optimizer are the model states of the ZeRO paper (Optimizer includes the
// fp32 master weights of mixed precision); Buffers are the gradient
// buckets, gathered layers and conversion scratch; Snapshot the host copy
// of an asynchronous checkpoint (checkpoint.async), once the first is taken.
type MemoryUse struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	Buffers     int64 `json:"buffers"`
	Snapshot    int64 `json:"snapshot,omitempty"`
	Total       int64 `json:"total"`
}

// Memory is what this rank holds now.
func (t *Trainer) Memory() MemoryUse {
	var u MemoryUse
	if t.grid != nil {
		u = t.grid.memory()
	} else {
		z := t.zero.Memory()
		u = MemoryUse{Params: z.Params, Grads: z.Grads, Optimizer: z.Optimizer, Activations: t.model.ActivationBytes(), Buffers: z.Buffers}
		u.Total = u.Params + u.Grads + u.Optimizer + u.Activations + u.Buffers
	}
	u.Snapshot = t.snapshotBytes()
	u.Total += u.Snapshot
	return u
}

// blockedTime is comm.BlockedTime, which a test replaces by a counter of
// its own: the process's count mixes in-process ranks' waits, and a real
// wait's length is the machine's.
var blockedTime = comm.BlockedTime

// record is the status record of the step just taken (step is its number).
func (t *Trainer) record(step int, o stepOutcome, elapsed time.Duration, tokens int) Record {
	r := Record{
		Step: step, Steps: t.spec.Steps, Loss: o.loss, LR: o.lr, GradNorm: o.res.Norm, Skipped: o.res.Skipped,
		StepMillis: float64(elapsed.Microseconds()) / 1000,
		TokensPerS: float64(tokens) / max(elapsed.Seconds(), 1e-9),
		Memory:     t.Memory(),
	}
	// Growth since the step began (runStep), not since the last record:
	// the evaluation, checkpoint and log gather between two steps are
	// neither's. min: the count is the process's, which in-process ranks
	// (tests) share.
	r.WaitMillis = min(float64((blockedTime()-t.commWait).Microseconds())/1000, r.StepMillis)
	if t.spec.Precision == "fp16" {
		r.LossScale = t.scaler().LossScale()
	}
	if t.grid != nil {
		c := t.grid.groups.Coord
		r.Coord = &c
	}
	return r
}

// report writes the status record, and every LogEvery steps (and at the
// first and last, and at every step with a value that is not finite) a log
// line.
func (t *Trainer) report(r Record) {
	if t.env.Status != nil {
		if b, err := json.Marshal(r); err == nil {
			t.env.Status.Write(append(b, '\n'))
		} else {
			t.env.Warn(fmt.Sprintf("train: status record of step %d: %v", r.Step, err))
		}
	}
	t.logMetrics(r)
	bad := !r.finite()
	every := t.spec.LogEvery
	if !bad && (every == 0 || (r.Step%every != 0 && r.Step != 1 && r.Step != r.Steps && r.ValLoss == nil)) {
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

// finite reports whether every value of r is finite.
func (r Record) finite() bool {
	ok := finite(float64(r.Loss)) && finite(r.GradNorm) && finite(r.StepMillis) && finite(r.TokensPerS)
	return ok && (r.ValLoss == nil || finite(float64(*r.ValLoss)))
}
