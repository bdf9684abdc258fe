package pipeline

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
)

// Stage is one rank's part of the model for Run: its Chunks model chunks
// (one unless the schedule is interleaved), chunk c being virtual stage
// c·Stages + rank. Buffers are float32s that Run owns:
//
//   - in, the activation a chunk's Forward receives, stays unchanged until
//     the Backward of the same chunk and micro-batch returns, so the stage
//     may keep it as its saved input instead of copying it;
//   - out and din are Run's to send once the call returns: the stage fills
//     them and keeps no reference;
//   - dout is valid only during the Backward call.
type Stage interface {
	// InputLen is the length of the activation entering chunk from the
	// previous virtual stage, and of the gradient chunk's Backward returns
	// to it. It is not asked on the first virtual stage.
	InputLen(chunk int) int
	// OutputLen is the length of the activation chunk's Forward passes to
	// the next virtual stage, and of the gradient it gets back. It is not
	// asked on the last virtual stage.
	OutputLen(chunk int) int
	// Forward runs micro-batch micro through chunk, from in (nil on the
	// first virtual stage, which reads its own data) into out (nil on the
	// last, which computes the loss instead).
	Forward(ctx context.Context, chunk, micro int, in, out []float32) error
	// Backward runs micro-batch micro back through chunk, from dout (nil
	// on the last virtual stage: the gradient starts at the loss) into din
	// (nil on the first), accumulating the parameters' gradients.
	Backward(ctx context.Context, chunk, micro int, dout, din []float32) error
}

// Run executes this rank's part of schedule s with stage: pp is the
// pipeline group, pp.Rank() this rank's stage (nil when s.Stages is 1).
// Every rank of pp calls Run with the same s; Run returns when this rank's
// operations and transfers are done, or at the first failure, or when ctx
// ends. A failed or cancelled transfer aborts pp (comm's rule), which
// brings its peers down too; after any error pp is unusable, and the
// caller should close it so that no peer waits out its timeout.
func Run(ctx context.Context, s Schedule, stage Stage, pp *comm.Communicator) (err error) {
	rank, err := checkRun(s, pp)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &runner{s: s, st: stage, ctx: ctx, pool: map[int][][]float32{},
		outs: map[msg][]float32{}, ins: map[msg]received{}, saved: map[[2]int][]float32{}}
	steps := s.Steps(rank)
	if pp != nil {
		r.link = newLink(ctx, pp, len(steps))
		defer func() {
			if err != nil {
				cancel(err) // stop the transfers still queued or running
			}
			if lerr := r.link.close(); err == nil && lerr != nil {
				err = fmt.Errorf("pipeline: stage %d of %d: %w", rank, s.Stages, lerr)
			}
		}()
	}
	for i := range steps {
		if err := r.step(&steps[i]); err != nil {
			return fmt.Errorf("pipeline: stage %d of %d: %w", rank, s.Stages, err)
		}
	}
	return nil
}

// checkRun returns this rank's stage, or why s cannot run over pp.
func checkRun(s Schedule, pp *comm.Communicator) (int, error) {
	if err := s.Validate(); err != nil {
		return 0, err
	}
	size, rank := 1, 0
	if pp != nil {
		size, rank = pp.Size(), pp.Rank()
	}
	if size != s.Stages {
		return 0, fmt.Errorf("pipeline: %s schedule for %d stages run on a pipeline group of %d ranks: build the schedule with the group's size", s.Kind, s.Stages, size)
	}
	return rank, nil
}

// runner is one Run: the buffers in use and the transfers in flight.
type runner struct {
	s    Schedule
	st   Stage
	ctx  context.Context
	link *link
	// pool holds free buffers by length, so that a step reuses the
	// buffers of finished transfers instead of allocating.
	pool  map[int][][]float32
	outs  map[msg][]float32    // outputs made and not yet sent
	ins   map[msg]received     // inputs received (or arriving), not yet used
	saved map[[2]int][]float32 // each forward's input, by (chunk, micro), until its backward
}

// received is an input and the transfer that fills it.
type received struct {
	buf []float32
	x   *xfer
}

func (r *runner) step(st *Step) error {
	if st.Op == nil {
		return r.transfer(st)
	}
	var in []float32
	if t := r.s.input(st.Op); t != nil {
		got := r.ins[t.key()]
		delete(r.ins, t.key())
		if err := r.wait(got.x); err != nil {
			return err
		}
		in = got.buf
	}
	if err := r.ctx.Err(); err != nil {
		return context.Cause(r.ctx)
	}
	if st.Op.Pass == Forward {
		return r.forward(st.Op, in)
	}
	return r.backward(st.Op, in)
}

// transfer issues st's communicator operation, to run while this rank
// computes: an output made before, sent; an input, received into a buffer
// of the length its chunk takes.
func (r *runner) transfer(st *Step) error {
	var send, recv []float32
	if t := st.Send; t != nil {
		send = r.outs[t.key()]
		delete(r.outs, t.key())
	}
	if t := st.Recv; t != nil {
		var n int
		var err error
		if t.Pass == Forward { // an activation for the next virtual stage
			n, err = checkLen("input", (t.Stage+1)/r.s.Stages, r.st.InputLen((t.Stage+1)/r.s.Stages))
		} else { // a gradient for the previous one
			n, err = checkLen("output", (t.Stage-1)/r.s.Stages, r.st.OutputLen((t.Stage-1)/r.s.Stages))
		}
		if err != nil {
			return err
		}
		recv = r.get(n)
	}
	x := r.link.issue(st, send, recv)
	if st.Recv != nil {
		r.ins[st.Recv.key()] = received{recv, x}
	}
	return nil
}

func (r *runner) forward(op *Op, in []float32) error {
	var out []float32
	t := r.s.output(op)
	if t != nil {
		n, err := checkLen("output", op.Chunk, r.st.OutputLen(op.Chunk))
		if err != nil {
			return err
		}
		out = r.get(n)
	}
	if err := r.st.Forward(r.ctx, op.Chunk, op.Micro, in, out); err != nil {
		return fmt.Errorf("forward of micro-batch %d (chunk %d): %w", op.Micro, op.Chunk, err)
	}
	if in != nil {
		r.saved[[2]int{op.Chunk, op.Micro}] = in
	}
	if t != nil {
		r.outs[t.key()] = out
	}
	return nil
}

func (r *runner) backward(op *Op, dout []float32) error {
	var din []float32
	t := r.s.output(op)
	if t != nil {
		n, err := checkLen("input", op.Chunk, r.st.InputLen(op.Chunk))
		if err != nil {
			return err
		}
		din = r.get(n)
	}
	if err := r.st.Backward(r.ctx, op.Chunk, op.Micro, dout, din); err != nil {
		return fmt.Errorf("backward of micro-batch %d (chunk %d): %w", op.Micro, op.Chunk, err)
	}
	key := [2]int{op.Chunk, op.Micro}
	r.put(r.saved[key])
	delete(r.saved, key)
	r.put(dout) // its transfer is done: step waited for it
	if t != nil {
		r.outs[t.key()] = din
	}
	return nil
}

func checkLen(what string, chunk, n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("chunk %d: %s length %d: a stage's activations need at least one element", chunk, what, n)
	}
	return n, nil
}

// get returns a buffer of n floats, reusing one whose transfer is done.
func (r *runner) get(n int) []float32 {
	if r.link != nil {
		for _, b := range r.link.reap() {
			r.put(b)
		}
	}
	free := r.pool[n]
	if k := len(free); k > 0 {
		b := free[k-1]
		r.pool[n] = free[:k-1]
		return b
	}
	return make([]float32, n)
}

func (r *runner) put(b []float32) {
	if b != nil {
		r.pool[len(b)] = append(r.pool[len(b)], b)
	}
}

// wait waits for x, and so for every transfer issued before it, and
// returns the first of their errors (a later one is only comm's "aborted").
func (r *runner) wait(x *xfer) error {
	select {
	case <-x.done:
	case <-r.ctx.Done():
		return context.Cause(r.ctx)
	}
	for _, b := range r.link.reap() {
		r.put(b)
	}
	return r.link.err
}
