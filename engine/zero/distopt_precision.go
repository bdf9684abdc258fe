package zero

import (
	"context"
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
)

// Mixed precision of the distributed optimizer. The stage computes with
// float32 slices whose values are the master weights rounded to bf16 or
// fp16, so that its numerics are those of 16-bit storage; the optimizer
// steps the fp32 masters of the elements it owns and rounds them back.

// orF32 reads an unset type as Float32.
func orF32(t comm.DType) comm.DType {
	if t == 0 {
		return comm.Float32
	}
	return t
}

// checkDistTypes refuses a parameter or gradient type the optimizer does
// not keep.
func checkDistTypes(cfg DistConfig) error {
	switch {
	case cfg.Params != comm.Float32 && cfg.Params != comm.BFloat16 && cfg.Params != comm.Float16:
		return fmt.Errorf("zero: distributed optimizer: parameters in %s: want fp32, bf16 or fp16", cfg.Params)
	case cfg.Grads != comm.Float32 && cfg.Grads != cfg.Params:
		return fmt.Errorf("zero: distributed optimizer: gradients in %s with parameters in %s: set parallel.grad_dtype to fp32 or to the precision", cfg.Grads, cfg.Params)
	}
	return cfg.Scaler.validate()
}

// Reload takes the current parameters as the exact values to train from
// (NewDist's, or those a checkpoint has just written into them, in fp32):
// in mixed precision it copies the owned ones into the master weights and
// rounds every parameter to the working type. Every rank of the DP group
// must hold the same parameters, so they round them alike. In fp32 it
// does nothing.
func (d *DistOptimizer) Reload() {
	if d.cfg.Params == comm.Float32 {
		return
	}
	d.master = append(d.master[:0], d.params[d.lo:d.hi]...)
	roundTo(d.cfg.Params, d.params)
}

// Masters is the fp32 values of the owned elements, Owned's range, which a
// checkpoint saves: the master weights in mixed precision, the parameters
// themselves in fp32. The slice aliases the optimizer's state.
func (d *DistOptimizer) Masters() []float32 {
	if d.master == nil {
		return d.params[d.lo:d.hi]
	}
	return d.master
}

// masterOf is the fp32 values of an owned piece, which AdamW updates.
func (d *DistOptimizer) masterOf(pc piece) []float32 {
	if d.master == nil {
		return d.params[pc.lo : pc.lo+pc.n]
	}
	return d.master[pc.at : pc.at+pc.n]
}

// publish rounds the updated masters into the owned parameters.
func (d *DistOptimizer) publish() {
	if d.master != nil {
		copy(d.params[d.lo:d.hi], d.master)
		roundTo(d.cfg.Params, d.params[d.lo:d.hi])
	}
}

// roundTo rounds v in place to the nearest value of type t (bf16 or fp16;
// fp32 leaves it as it is), through a small stack buffer, with comm's
// conversions: those the wire and the data-parallel engine use.
func roundTo(t comm.DType, v []float32) {
	var tmp [chunk]uint16
	for lo := 0; lo < len(v); lo += chunk {
		s, h := v[lo:min(lo+chunk, len(v))], tmp[:min(chunk, len(v)-lo)]
		switch t {
		case comm.BFloat16:
			comm.EncodeBF16(h, s)
			comm.DecodeBF16(s, h)
		case comm.Float16:
			comm.EncodeF16(h, s)
			comm.DecodeF16(s, h)
		default:
			return
		}
	}
}

// reduceHalf is reduce with the gradients averaged in their 16-bit type
// (parallel.grad_dtype): encoded into the wire buffer, averaged over DP
// (all of them, or into the owned block), decoded back. With one DP rank
// they are still rounded to the type, so that an fp16 run overflows, and
// its loss scale moves, as it would with several.
func (d *DistOptimizer) reduceHalf(ctx context.Context) error {
	dp, c := d.gs.DP, d.gs.Coord
	if dp.Size() == 1 {
		roundTo(d.cfg.Grads, d.grads)
		return nil
	}
	encode(d.wire, d.grads)
	if d.cfg.Stage == 0 {
		if err := dp.AllReduce(ctx, d.wire, comm.Avg); err != nil {
			return fmt.Errorf("zero: step: all-reduce of the %s gradients over dp %d (rank dp=%d pp=%d tp=%d): %w", d.cfg.Grads, dp.Size(), c.DP, c.PP, c.TP, err)
		}
		decode(d.grads, d.wire)
		return nil
	}
	mine := d.wire.Slice(d.lo, d.hi)
	if err := dp.ReduceScatter(ctx, d.wire, mine, comm.Avg); err != nil {
		return fmt.Errorf("zero: step: reduce-scatter of the %s gradients over dp %d (rank dp=%d pp=%d tp=%d): %w", d.cfg.Grads, dp.Size(), c.DP, c.PP, c.TP, err)
	}
	decode(d.grads[d.lo:d.hi], mine)
	return nil
}

// LossScale is what the loss is multiplied by before backward (its
// gradient, model.Stage.DLoss): 1 unless fp16 loss scaling is on.
func (d *DistOptimizer) LossScale() float64 { return d.scaler.Scale }

// Scaler is the loss scaler's state, for a checkpoint.
func (d *DistOptimizer) Scaler() ScalerState { return d.scaler.ScalerState }

// RestoreScaler continues from a checkpoint's scaler state.
func (d *DistOptimizer) RestoreScaler(s ScalerState) {
	if s.Scale > 0 && !math.IsInf(s.Scale, 0) {
		d.scaler.ScalerState = s
	}
}

// Overflow ends a step whose loss was not finite as Step ends one whose
// gradients were not: nothing is updated, the gradients are dropped, and
// fp16 loss scaling counts it as an overflow. It is not a collective, but
// every rank must call it for the same step (the trainer's loss is the
// mean over the world, so they agree).
func (d *DistOptimizer) Overflow() StepResult {
	return d.overflow(StepResult{Norm: math.NaN()})
}

// overflow drops the step's gradients. Dynamic fp16 loss scaling absorbs
// the step by halving the scale, unless it is already at its minimum,
// where halving cannot help any more (as Engine.overflow).
func (d *DistOptimizer) overflow(res StepResult) StepResult {
	res.NonFinite = true
	if d.scaler.dynamic && d.scaler.Scale > d.scaler.cfg.MinScale {
		res.Skipped = true
		d.scaler.update(true)
	}
	clear(d.grads)
	return res
}
