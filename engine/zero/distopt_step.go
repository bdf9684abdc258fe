package zero

import (
	"context"
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/optim"
)

// Step applies AdamW at lr once the step's gradients are complete on
// every rank (pipeline.Run, then model.Stage's ReduceNorms and
// ReduceTied). It averages the gradients over the DP group (all-reduce at
// ZeRO-0, reduce-scatter into the owned part at ZeRO-1), takes the global
// norm over the world with each element counted once, updates the owned
// elements (their fp32 masters in mixed precision) with the loss scale's
// removal and the clip factor folded into the gradient, rounds them into
// the parameters, all-gathers the updated parameters over DP (ZeRO-1),
// and clears the gradients. It is a collective over the DP group and the
// world: every rank calls it for the same step.
//
// A step whose gradients are not finite anywhere in the model updates
// nothing on any rank (NonFinite): the norm's all-reduce tells every rank.
// With dynamic fp16 loss scaling it is an overflow: Skipped, and the scale
// halved on every rank alike.
func (d *DistOptimizer) Step(ctx context.Context, lr float64) (StepResult, error) {
	if err := d.reduce(ctx); err != nil {
		return StepResult{}, err
	}
	norm, err := d.globalNorm(ctx)
	if err != nil {
		return StepResult{}, err
	}
	scale := d.scaler.Scale
	res := StepResult{Norm: norm / scale}
	if math.IsNaN(res.Norm) || math.IsInf(res.Norm, 0) {
		return d.overflow(res), nil
	}
	d.scaler.update(false)
	// Both factors exactly 1 in fp32 without clipping; a power-of-two
	// scale divides out exactly.
	factor := optim.ClipScale(res.Norm, d.cfg.Optim.GradClip) / scale
	parts := make([]optim.Part, len(d.pieces))
	for i, pc := range d.pieces {
		parts[i] = optim.Part{P: d.masterOf(pc), G: d.grads[pc.lo : pc.lo+pc.n], At: pc.at, Decay: pc.param.Decay}
	}
	d.opt.UpdateParts(parts, lr, float32(factor))
	clear(d.grads)
	d.publish()
	return res, d.gather(ctx)
}

// reduce averages the gradients over the DP group: all of them (ZeRO-0),
// or into the owned block, in place (ZeRO-1; the rest is left undefined).
func (d *DistOptimizer) reduce(ctx context.Context) error {
	if d.cfg.Grads != comm.Float32 {
		return d.reduceHalf(ctx)
	}
	dp := d.gs.DP
	if dp.Size() == 1 {
		return nil
	}
	all := comm.F32(d.grads)
	if d.cfg.Stage == 0 {
		if err := dp.AllReduce(ctx, all, comm.Avg); err != nil {
			return fmt.Errorf("zero: step: all-reduce of the gradients over dp %d (rank dp=%d pp=%d tp=%d): %w", dp.Size(), d.gs.Coord.DP, d.gs.Coord.PP, d.gs.Coord.TP, err)
		}
		return nil
	}
	if err := dp.ReduceScatter(ctx, all, comm.F32(d.grads[d.lo:d.hi]), comm.Avg); err != nil {
		return fmt.Errorf("zero: step: reduce-scatter of the gradients over dp %d (rank dp=%d pp=%d tp=%d): %w", dp.Size(), d.gs.Coord.DP, d.gs.Coord.PP, d.gs.Coord.TP, err)
	}
	return nil
}

// globalNorm is the L2 norm of the whole model's averaged gradient: each
// rank sums the squares of the owned elements it counts (see counts) in
// float64, and one all-reduce over the world adds them, the sum sent as
// two float32s (high and low part) so that it keeps about 48 bits. NaN or
// +Inf when any rank holds a gradient that is not finite, counted or not.
func (d *DistOptimizer) globalNorm(ctx context.Context) (float64, error) {
	var sq squares
	for i, pc := range d.pieces {
		g := d.grads[pc.lo : pc.lo+pc.n]
		if d.counted[i] {
			sq.add(g)
		} else {
			sq.flag(g)
		}
	}
	if w := d.gs.World; w.Size() > 1 {
		hi := float32(sq.sum)
		v := []float32{hi, float32(sq.sum - float64(hi)), float32(sq.nan), float32(sq.inf)}
		if err := w.AllReduce(ctx, comm.F32(v), comm.Sum); err != nil {
			return 0, fmt.Errorf("zero: step: all-reduce of the gradient norm over %d ranks (rank dp=%d pp=%d tp=%d): %w", w.Size(), d.gs.Coord.DP, d.gs.Coord.PP, d.gs.Coord.TP, err)
		}
		sq = squares{sum: float64(v[0]) + float64(v[1]), nan: int(v[2]), inf: int(v[3])}
	}
	return sq.norm(), nil
}

// gather shares the updated owned blocks over the DP group (ZeRO-1), in
// place, so that every replica holds the whole updated shard again.
func (d *DistOptimizer) gather(ctx context.Context) error {
	dp := d.gs.DP
	if d.cfg.Stage == 0 || dp.Size() == 1 {
		return nil
	}
	if err := dp.AllGather(ctx, comm.F32(d.params[d.lo:d.hi]), comm.F32(d.params)); err != nil {
		return fmt.Errorf("zero: step: all-gather of the updated parameters over dp %d (rank dp=%d pp=%d tp=%d): %w", dp.Size(), d.gs.Coord.DP, d.gs.Coord.PP, d.gs.Coord.TP, err)
	}
	return nil
}

// flag counts g's NaN and infinite values without adding its squares: a
// rank that does not count a tensor in the norm still must not let a
// non-finite gradient pass.
func (s *squares) flag(g []float32) {
	for _, v := range g {
		switch f := float64(v); {
		case f != f:
			s.nan++
		case math.IsInf(f, 0):
			s.inf++
		}
	}
}
