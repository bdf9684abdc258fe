package zero

import (
	"math"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/optim"
)

// BeginMicro says that micro-batch i of n of the step starts: gradients
// of stages 0–1 are all-reduced after the last one only, those of stages
// 2–3 reduce-scattered after each.
func (e *Engine) BeginMicro(i, n int) { e.micro, e.micros = i, n }

// LossScale is what the loss is multiplied by before backward (1 unless
// fp16 loss scaling is on).
func (e *Engine) LossScale() float64 { return e.scaler.Scale }

// Scaler is the loss scaler's state.
func (e *Engine) Scaler() ScalerState { return e.scaler.ScalerState }

// RestoreScaler continues from a checkpoint's scaler state.
func (e *Engine) RestoreScaler(s ScalerState) {
	if s.Scale > 0 {
		e.scaler.ScalerState = s
	}
}

// StepResult is what an optimizer step did.
type StepResult struct {
	Norm    float64 // global gradient norm, unscaled, before clipping
	Skipped bool    // gradients overflowed (fp16): nothing was updated
}

// Step finishes the step's reductions and applies AdamW at lr to the owned
// parameters: global norm over every rank's part, fp16 overflow check,
// loss-scale removal and clipping folded into the update; then it shares
// the updated parameters (all-gather, stages 1–2) and clears the
// gradients.
func (e *Engine) Step(lr float64) (StepResult, error) {
	e.drain()
	if e.err != nil {
		return StepResult{}, e.err
	}
	gradOf, scratch := e.ownedGrads()
	defer e.pool.putF32(scratch)
	var sum float64
	var bad int
	for _, pc := range e.pieces { // in flat order, as a single rank sums
		sum, bad = sumSquares(gradOf(pc), sum, bad)
	}
	if e.part.Ranks > 1 {
		hi := float32(sum)
		v := []float32{hi, float32(sum - float64(hi)), float32(bad)}
		if err := e.comm.AllReduce(e.ctx, comm.F32(v), comm.Sum); err != nil {
			return StepResult{}, err
		}
		sum, bad = float64(v[0])+float64(v[1]), int(v[2])
	}
	scale := e.scaler.Scale
	res := StepResult{Norm: math.Sqrt(sum) / scale}
	overflow := bad > 0 || math.IsInf(sum, 0) || math.IsNaN(sum)
	if overflow && e.scaler.dynamic {
		res.Skipped = true
		e.scaler.update(true)
		e.clearGrads()
		return res, nil
	}
	e.scaler.update(false)
	factor := 1 / scale
	if c := e.cfg.Optim.GradClip; c > 0 && res.Norm > c {
		factor *= c / (res.Norm + 1e-6)
	}
	parts := make([]optim.Part, len(e.pieces))
	for i, pc := range e.pieces {
		parts[i] = optim.Part{P: e.masterOf(pc), G: gradOf(pc), At: pc.at, Decay: pc.param.Decay}
	}
	e.opt.UpdateParts(parts, lr, float32(factor))
	e.clearGrads()
	return res, e.publish()
}

// ownedGrads gives the fp32 gradients of each owned piece: views of the
// gradients when they are fp32 (in the full gradients at stages 0–1, in the
// owned ones at 2–3), else decoded into scratch, returned so that the
// caller gives it back.
func (e *Engine) ownedGrads() (gradOf func(piece) []float32, scratch []float32) {
	switch {
	case e.cfg.Grads == comm.Float32 && e.cfg.Stage >= 2:
		g := e.ownGrad.Float32s()
		return func(pc piece) []float32 { return g[pc.at : pc.at+pc.n] }, nil
	case e.cfg.Grads == comm.Float32:
		g := e.grads.Float32s()
		return func(pc piece) []float32 { return g[pc.lo : pc.lo+pc.n] }, nil
	}
	scratch = e.pool.f32(e.part.Size())
	if e.cfg.Stage >= 2 {
		decode(scratch, e.ownGrad)
	} else {
		for i := range e.part.Segments {
			lo, hi, at := e.part.Owned(i)
			decode(scratch[at:at+hi-lo], e.grads.Slice(lo, hi))
		}
	}
	return func(pc piece) []float32 { return scratch[pc.at : pc.at+pc.n] }, scratch
}

// sumSquares adds Σg² (in float64, in order) to sum and the count of
// non-finite values to bad.
func sumSquares(g []float32, sum float64, bad int) (float64, int) {
	for _, v := range g {
		f := float64(v)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			bad++
			continue
		}
		sum += f * f
	}
	return sum, bad
}

func (e *Engine) clearGrads() {
	clear(e.grads.Bytes())
	clear(e.ownGrad.Bytes())
}

// publish makes the working parameters follow the updated master weights:
// rounded to the working type, and all-gathered where other ranks own
// parts of them (stages 1–2).
func (e *Engine) publish() error {
	switch {
	case e.cfg.Stage == 3:
		if e.cfg.Params != comm.Float32 {
			encode(e.own, e.master)
		}
		return nil
	case e.part.Ranks == 1:
		if e.master != nil {
			encode(e.work, e.master) // stage 0 owns all, in flat order
		}
		return nil
	}
	for i, s := range e.part.Segments {
		lo, hi, at := e.part.Owned(i)
		mine := e.work.Slice(lo, hi)
		if e.master != nil {
			encode(mine, e.master[at:at+hi-lo])
		}
		e.start(e.comm.AllGatherAsync(e.ctx, mine, e.work.Slice(s.Offset, s.Offset+s.Size)), nil)
	}
	e.drain()
	return e.err
}

// Mean averages v (one value per rank) over the ranks, in place.
func (e *Engine) Mean(v []float32) error {
	if e.comm == nil {
		return nil
	}
	return e.comm.AllReduce(e.ctx, comm.F32(v), comm.Avg)
}

// Err is the first collective error of the engine, if any: Store methods
// cannot return one, so a forward pass alone (evaluation) checks here.
func (e *Engine) Err() error {
	e.drain()
	return e.err
}
