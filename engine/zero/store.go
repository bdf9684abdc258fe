package zero

import (
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
)

// maxInFlight bounds the gradient collectives in progress during backward
// (and so the bucket buffers held): with two, one bucket is on the wire
// while the next fills.
const maxInFlight = 2

// unitRange is unit u's flat range.
func (e *Engine) unitRange(u int) (lo, hi int) {
	x := e.units[u]
	return x.Offset, x.Offset + x.Size
}

// direct reports whether the model can use the working parameters in
// place: fp32, not partitioned.
func (e *Engine) direct() bool { return e.cfg.Stage < 3 && e.cfg.Params == comm.Float32 }

// Weights returns unit u's parameters as float32: a view of the working
// parameters (fp32, stages 0–2), their fp32 decoding (mixed precision), or
// the unit gathered from every rank's part (stage 3).
func (e *Engine) Weights(u int) []float32 {
	lo, hi := e.unitRange(u)
	if e.direct() {
		return e.work.Float32s()[lo:hi]
	}
	lu := e.live[u]
	if lu == nil {
		lu = e.fetch(u)
	}
	lu.refs++
	if lu.f32 != nil {
		return lu.f32
	}
	if lu.h != nil {
		e.wait(lu.h)
	}
	switch {
	case lu.raw.DType() == comm.Float32:
		lu.f32 = lu.raw.Float32s()
	case u == 0 && e.cfg.Stage < 3:
		lu.f32, lu.raw = e.embedding(lu.raw), comm.Buffer{}
	default:
		lu.f32, lu.pool = e.pool.f32(hi-lo), true
		e.decodeAll(lu.f32, lu.raw)
		if e.cfg.Stage == 3 {
			e.pool.put(lu.raw)
		}
		lu.raw = comm.Buffer{}
	}
	return lu.f32
}

// WeightsBF16 implements model.BF16Weights: with bf16 working
// parameters, unit u's as they are, a view of them (stages 0–2) or the
// unit gathered (stage 3), instead of Weights' fp32 decoding, which the
// model's bf16 matmuls would round straight back. Nil for other types,
// and for a stage-3 unit that Weights has decoded while it is live.
func (e *Engine) WeightsBF16(u int) []uint16 {
	if e.cfg.Params != comm.BFloat16 {
		return nil
	}
	lo, hi := e.unitRange(u)
	if e.cfg.Stage < 3 {
		return e.work.Uint16s()[lo:hi:hi]
	}
	lu := e.live[u]
	if lu == nil {
		lu = e.fetch(u)
	}
	if lu.raw.Len() == 0 {
		return nil
	}
	lu.refs++
	if lu.h != nil {
		e.wait(lu.h)
	}
	return lu.raw.Uint16s()
}

// embedding is the embedding unit's fp32 decoding (raw, stages 0–2),
// kept from one use to the next until the working parameters change
// (publish): forward uses the unit twice (the token embeddings, then the
// tied output layer) and backward starts with it, so three decodes of the
// largest unit per micro-batch become one per step. Its buffer comes from
// the pool, which held one of its size between uses anyway.
func (e *Engine) embedding(raw comm.Buffer) []float32 {
	if e.emb == nil {
		e.emb = e.pool.f32(raw.Len())
	}
	if !e.embValid {
		e.decodeAll(e.emb, raw)
		e.embValid = true
	}
	return e.emb
}

// fetch starts getting unit u: an all-gather of its parts (stage 3), or a
// view of the low-precision working parameters to decode.
func (e *Engine) fetch(u int) *liveUnit {
	lo, hi := e.unitRange(u)
	lu := &liveUnit{}
	e.live[u] = lu
	if e.cfg.Stage < 3 {
		lu.raw = e.work.Slice(lo, hi)
		return lu
	}
	lu.raw = e.pool.get(e.cfg.Params, hi-lo)
	olo, ohi, at := e.part.Owned(e.segOf[u])
	mine := e.own.Slice(at, at+ohi-olo)
	if e.comm == nil {
		copy(lu.raw.Bytes(), mine.Bytes())
		return lu
	}
	lu.h = e.comm.AllGatherAsync(e.ctx, mine, lu.raw)
	return lu
}

// Prefetch starts gathering unit u (stage 3) so that it arrives while the
// current unit computes.
func (e *Engine) Prefetch(u int) {
	if e.cfg.Stage < 3 || u < 0 || u >= len(e.units) || e.live[u] != nil {
		return
	}
	e.fetch(u)
}

// Release ends the model's use of unit u's parameters.
func (e *Engine) Release(u int) {
	lu := e.live[u]
	if lu == nil || e.direct() {
		return
	}
	if lu.refs--; lu.refs > 0 {
		return
	}
	if lu.pool {
		e.pool.putF32(lu.f32)
	} else if e.cfg.Stage == 3 {
		e.pool.put(lu.raw)
	}
	delete(e.live, u)
}

// Grads returns where backward accumulates unit u's gradients: a view of
// the full fp32 gradients (stages 0–1), a zeroed slice of the bucket being
// filled (fp32, stages 2–3), or zeroed fp32 scratch to convert.
func (e *Engine) Grads(u int) []float32 {
	lo, hi := e.unitRange(u)
	if e.cfg.Grads == comm.Float32 {
		if e.cfg.Stage < 2 {
			return e.grads.Float32s()[lo:hi]
		}
		s := e.sendBuffer(e.segOf[u]).Float32s()
		g := s[lo-e.part.Segments[e.segOf[u]].Offset:][:hi-lo]
		clear(g)
		return g
	}
	g := e.pool.f32(hi - lo)
	e.clearAll(comm.F32(g))
	e.open[u] = g
	return g
}

// GradsWrite implements model.GradsWriter: with 16-bit gradients, the
// float32 scratch of unit u without Grads' clearing, which the model's
// weight-gradient matmuls would read back only to add to zero (GradsDone
// rounds it whole: store's 0 + v gives a -0 written by the matmul the +0
// of a sum). Nil with fp32 gradients, which accumulate in place.
func (e *Engine) GradsWrite(u int) []float32 {
	if e.cfg.Grads == comm.Float32 {
		return nil
	}
	lo, hi := e.unitRange(u)
	g := e.pool.f32(hi - lo)
	e.open[u] = g
	return g
}

// sendBuffer is the bucket of segment i, allocated (after the oldest
// collective in flight has finished, if too many are) when first needed.
func (e *Engine) sendBuffer(i int) comm.Buffer {
	if b, ok := e.send[i]; ok {
		return b
	}
	for len(e.inflight) >= maxInFlight {
		e.finishOldest()
	}
	b := e.pool.get(e.cfg.Grads, e.part.Segments[i].Size)
	e.send[i] = b
	return b
}

// GradsDone files unit u's gradients of this micro-batch and, when its
// segment is complete, starts the segment's reduction.
func (e *Engine) GradsDone(u int) {
	lo, hi := e.unitRange(u)
	seg := e.segOf[u]
	if g, ok := e.open[u]; ok {
		delete(e.open, u)
		switch {
		case e.cfg.Stage < 2:
			e.accumulateAll(e.grads.Slice(lo, hi), g, e.fresh[u])
			e.fresh[u] = false
		default:
			off := e.part.Segments[seg].Offset
			e.encodeAll(e.sendBuffer(seg).Slice(lo-off, hi-off), g)
		}
		e.pool.putF32(g)
	}
	s := e.part.Segments[seg]
	if e.done[seg]++; e.done[seg] == s.Last-s.First+1 {
		e.done[seg] = 0
		e.reduce(seg)
	}
}

// reduce starts the reduction of segment i's gradients: an all-reduce of
// the full gradients on the step's last micro-batch (stages 0–1), a
// reduce-scatter into the owned gradients on every micro-batch (stages
// 2–3). Averaging, so that the result is the gradient of the global batch's
// mean loss.
func (e *Engine) reduce(i int) {
	s := e.part.Segments[i]
	if e.cfg.Stage < 2 {
		if e.comm != nil && e.micro == e.micros-1 && !e.compress(i) {
			e.start(e.comm.AllReduceAsync(e.ctx, e.grads.Slice(s.Offset, s.Offset+s.Size), comm.Avg), nil)
		}
		return
	}
	send := e.send[i]
	delete(e.send, i)
	lo, hi, at := e.part.Owned(i)
	dst := e.ownGrad.Slice(at, at+hi-lo)
	recv, first := dst, e.micro == 0
	if !first { // accumulate into what earlier micro-batches left
		recv = e.pool.get(e.cfg.Grads, hi-lo)
	}
	after := func() { // may run during a later micro-batch
		if !first {
			addBuffer(dst, recv)
			e.pool.put(recv)
		}
		e.pool.put(send)
	}
	if e.comm == nil {
		copy(recv.Bytes(), send.Slice(lo-s.Offset, hi-s.Offset).Bytes())
		after()
		return
	}
	e.start(e.comm.ReduceScatterAsync(e.ctx, send, recv, comm.Avg), after)
}

func (e *Engine) start(h *comm.Handle, after func()) {
	e.inflight = append(e.inflight, flight{h, after})
}

// finishOldest waits for the oldest collective in flight and completes it.
func (e *Engine) finishOldest() {
	f := e.inflight[0]
	e.inflight = e.inflight[1:]
	e.wait(f.h)
	if f.after != nil {
		f.after()
	}
}

// wait waits for h, keeping the first error. The buffers of a failed
// collective are still completed (with whatever they hold) so that the
// engine's bookkeeping stays whole; the step reports the error.
func (e *Engine) wait(h *comm.Handle) {
	// Handle.Wait counts the time blocked (comm.BlockedTime): a rank
	// waiting here for a slower one is waiting, not working, and the
	// launcher's straggler marking tells them apart by it. Its buffers are
	// in use until Done even when the context ended first.
	_ = h.Wait(e.ctx)
	<-h.Done()
	if err := h.Wait(e.ctx); err != nil && e.err == nil {
		e.err = fmt.Errorf("zero: %w", err)
	}
}

// drain completes every collective in flight.
func (e *Engine) drain() {
	for len(e.inflight) > 0 {
		e.finishOldest()
	}
	if e.cz != nil {
		if err := e.cz.wait(); err != nil && e.err == nil {
			e.err = fmt.Errorf("zero: %w", err)
		}
	}
}
