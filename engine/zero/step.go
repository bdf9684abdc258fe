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
	// Norm is the global gradient norm, unscaled, before clipping: NaN
	// when a gradient was NaN, +Inf when one was infinite.
	Norm float64
	// NonFinite says that a gradient (or the loss, see Overflow) was NaN
	// or infinite: nothing was updated and the gradients were dropped.
	NonFinite bool
	// Skipped says that fp16 loss scaling absorbed a NonFinite step as an
	// overflow: the scale was halved and training may go on. A NonFinite
	// step that is not Skipped cannot be cured by the scaler (fp32, bf16,
	// a static scale, or the scale already at its minimum).
	Skipped bool
}

// Step finishes the step's reductions and applies AdamW at lr to the owned
// parameters: global norm over every rank's part, non-finite check (fp16
// overflow), loss-scale removal and clipping folded into the update; then
// it shares the updated parameters (all-gather, stages 1–2) and clears the
// gradients. A step whose gradients are not finite updates nothing, in
// any precision: one NaN would otherwise spread to every parameter.
func (e *Engine) Step(lr float64) (StepResult, error) {
	e.drain()
	if e.err != nil {
		return StepResult{}, e.err
	}
	var sq squares
	for _, pc := range e.pieces { // in flat order, as a single rank sums
		if e.cfg.Grads == comm.Float32 {
			sq.add(e.gradOf(pc))
		} else {
			sq.addDecoded(e.gradBuf(pc))
		}
	}
	if e.part.Ranks > 1 {
		hi := float32(sq.sum)
		v := []float32{hi, float32(sq.sum - float64(hi)), float32(sq.nan), float32(sq.inf)}
		if err := e.comm.AllReduce(e.ctx, comm.F32(v), comm.Sum); err != nil {
			return StepResult{}, err
		}
		sq = squares{sum: float64(v[0]) + float64(v[1]), nan: int(v[2]), inf: int(v[3])}
	}
	scale := e.scaler.Scale
	res := StepResult{Norm: sq.norm() / scale}
	if math.IsNaN(res.Norm) || math.IsInf(res.Norm, 0) {
		return e.overflow(res), nil
	}
	e.scaler.update(false)
	factor := 1 / scale
	factor *= optim.ClipScale(res.Norm, e.cfg.Optim.GradClip) // exactly 1 when not clipping
	e.update(lr, float32(factor))
	e.clearGrads()
	return res, e.publish(true)
}

// Overflow ends a step whose loss was not finite as Step ends one whose
// gradients were not: nothing is updated, the gradients are dropped, and
// fp16 loss scaling counts it as an overflow. Every rank must call it
// for the same step (the loss is their mean, so they agree).
func (e *Engine) Overflow() (StepResult, error) {
	e.drain()
	if e.err != nil {
		return StepResult{}, e.err
	}
	return e.overflow(StepResult{Norm: math.NaN()}), nil
}

// overflow drops the step's gradients. Dynamic fp16 loss scaling absorbs
// it by halving the scale, unless the scale is already at its minimum, where
// halving cannot help any more.
func (e *Engine) overflow(res StepResult) StepResult {
	res.NonFinite = true
	if e.scaler.dynamic && e.scaler.Scale > e.scaler.cfg.MinScale {
		res.Skipped = true
		e.scaler.update(true)
	}
	if e.cz != nil {
		e.cz.reset()
	}
	e.clearGrads()
	return res
}

// gradBuf is the reduced gradients of an owned piece: in the full
// gradients at stages 0–1, in the owned ones at 2–3.
func (e *Engine) gradBuf(pc piece) comm.Buffer {
	if e.cfg.Stage >= 2 {
		return e.ownGrad.Slice(pc.at, pc.at+pc.n)
	}
	return e.grads.Slice(pc.lo, pc.lo+pc.n)
}

// gradOf is gradBuf of fp32 gradients, as float32s.
func (e *Engine) gradOf(pc piece) []float32 { return e.gradBuf(pc).Float32s() }

// stepBlock is how many 16-bit gradients the step decodes at a time, into
// a buffer that stays in the L1 cache while they are used; blockLen is
// stepBlock except in tests, which cut the blocks short.
const stepBlock = 2048

var blockLen = stepBlock

// update applies AdamW at lr, gradients times factor, to the owned
// parameters on the engine's threads. With 16-bit parameters it goes a
// block at a time: 16-bit gradients are decoded as the update reads them
// (a decoded copy of them all, 4 bytes a parameter written once and read
// twice, cost more than the decoding), and the updated master weights
// are rounded into the working parameters while the block is in cache
// (publish then only shares them).
func (e *Engine) update(lr float64, factor float32) {
	if e.cfg.Params == comm.Float32 { // and so are the gradients (Validate)
		parts := make([]optim.Part, len(e.pieces))
		for i, pc := range e.pieces {
			parts[i] = optim.Part{P: e.masterOf(pc), G: e.gradOf(pc), At: pc.at, Decay: pc.param.Decay}
		}
		e.opt.UpdatePartsThreads(e.threads(), parts, lr, factor)
		return
	}
	st := e.opt.Begin(lr, factor)
	spread(e.threads(), e.part.Size(), func(lo, hi int) { e.updateBlocks(st, lo, hi) })
}

// updateBlocks updates the owned elements lo to hi (in owned order) of
// 16-bit parameters.
func (e *Engine) updateBlocks(st optim.Stepper, lo, hi int) {
	var buf [stepBlock]float32
	for _, pc := range e.pieces {
		gb, wb, p := e.gradBuf(pc), e.workOf(pc), e.masterOf(pc)
		for s := max(lo, pc.at); s < min(hi, pc.at+pc.n); s += blockLen {
			i := s - pc.at
			n := min(blockLen, hi-s, pc.n-i)
			g := buf[:n]
			if gb.DType() == comm.Float32 {
				g = gb.Float32s()[i : i+n]
			} else {
				decode(g, gb.Slice(i, i+n))
			}
			st.Update(optim.Part{P: p[i : i+n], G: g, At: s, Decay: pc.param.Decay})
			encode(wb.Slice(i, i+n), p[i:i+n])
		}
	}
}

// workOf is the working parameters of an owned piece: in the full ones
// at stages 0–2, in the owned ones at 3.
func (e *Engine) workOf(pc piece) comm.Buffer {
	if e.cfg.Stage == 3 {
		return e.own.Slice(pc.at, pc.at+pc.n)
	}
	return e.work.Slice(pc.lo, pc.lo+pc.n)
}

// squares accumulates Σg² in float64, in order, over the finite values,
// and counts the NaN and infinite ones.
type squares struct {
	sum      float64
	nan, inf int
}

func (s *squares) add(g []float32) {
	// The usual case first: every value finite. The sum is the same chain
	// of additions, in order, without the tests that made each element
	// cost twice the latency of one addition (AdamW's own pass is
	// vectorised; this one, serial too, was the step's slowest). A NaN or
	// infinity makes the sum NaN or +Inf (squares are never negative, and
	// finite squares of float32 cannot overflow it), and then the loop
	// below counts them as before.
	sum := s.sum
	for _, v := range g {
		f := float64(v)
		sum += f * f
	}
	if !math.IsNaN(sum) && !math.IsInf(sum, 0) {
		s.sum = sum
		return
	}
	for _, v := range g {
		f := float64(v)
		switch {
		case f != f:
			s.nan++
		case math.IsInf(f, 0):
			s.inf++
		default:
			s.sum += f * f
		}
	}
}

// addDecoded adds the squares of 16-bit gradients, decoded a block at a
// time: the same additions in the same order as add over their decoded
// copy, so the same sum and counts.
func (s *squares) addDecoded(b comm.Buffer) {
	var g [stepBlock]float32
	for lo := 0; lo < b.Len(); lo += blockLen {
		hi := min(lo+blockLen, b.Len())
		decode(g[:hi-lo], b.Slice(lo, hi))
		s.add(g[:hi-lo])
	}
}

// norm is the L2 norm: NaN if any value was NaN, +Inf if any was infinite
// (or the sum overflowed).
func (s squares) norm() float64 {
	switch {
	case s.nan > 0:
		return math.NaN()
	case s.inf > 0:
		return math.Inf(1)
	}
	return math.Sqrt(s.sum)
}

// clearGrads zeroes the gradients for the next step.
func (e *Engine) clearGrads() {
	e.clearAll(e.grads)
	e.clearAll(e.ownGrad)
	for u := range e.fresh {
		e.fresh[u] = true
	}
}

// publish makes the working parameters follow the updated master weights:
// rounded to the working type (unless the update rounded them already:
// rounded), and all-gathered where other ranks own parts of them (stages
// 1–2).
func (e *Engine) publish(rounded bool) error {
	e.embValid = false
	switch {
	case e.cfg.Stage == 3:
		if e.cfg.Params != comm.Float32 && !rounded {
			e.encodeAll(e.own, e.master)
		}
		return nil
	case e.part.Ranks == 1:
		if e.master != nil && !rounded {
			e.encodeAll(e.work, e.master) // stage 0 owns all, in flat order
		}
		return nil
	}
	for i, s := range e.part.Segments {
		lo, hi, at := e.part.Owned(i)
		mine := e.work.Slice(lo, hi)
		if e.master != nil && !rounded {
			e.encodeAll(mine, e.master[at:at+hi-lo])
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
