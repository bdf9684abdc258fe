package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
)

// Linear is the shape of one rank's part of a tensor-parallel linear layer
// y = x·W + b.
type Linear struct {
	// N is the number of token rows of the whole micro-batch (B·T), not of
	// a sequence shard.
	N int
	// In and Out are the dimensions of this rank's weight. Column-parallel:
	// In is the full input width, Out this rank's output features.
	// Row-parallel: In is this rank's input features, Out the full output
	// width.
	In, Out int
	// Transposed means W is stored [Out, In] (torch's nn.Linear; the tied
	// token embedding used as the output layer) rather than [In, Out]
	// (Hugging Face's Conv1D: every GPT-2 block weight).
	Transposed bool
}

// check validates the shape and the sizes of x (xRows×In), y (yRows×Out,
// named yName: the output or its gradient), the weight and the bias (may
// be nil).
func (l Linear) check(op, yName string, xRows, yRows int, x, y, w, b []float32) error {
	if l.N < 1 || l.In < 1 || l.Out < 1 {
		return fmt.Errorf("tensorpar: %s: shape N=%d In=%d Out=%d: every dimension must be at least 1", op, l.N, l.In, l.Out)
	}
	err := errors.Join(checkLen(op, "x", len(x), xRows*l.In), checkLen(op, yName, len(y), yRows*l.Out),
		checkLen(op, "the weight", len(w), l.In*l.Out))
	if b != nil && err == nil {
		err = checkLen(op, "the bias", len(b), l.Out)
	}
	return err
}

// ldw is W's leading dimension.
func (l Linear) ldw() int {
	if l.Transposed {
		return l.In
	}
	return l.Out
}

// forward writes y = x·W for rows rows of x.
func (l Linear) forward(be backend.Backend, y, x, w []float32, rows int) {
	be.Matmul(false, l.Transposed, rows, l.Out, l.In, x, l.In, w, l.ldw(), 0, y, l.Out)
}

// inputGrad writes dx = dy·Wᵀ for rows rows.
func (l Linear) inputGrad(be backend.Backend, dx, dy, w []float32, rows int) {
	be.Matmul(false, !l.Transposed, rows, l.In, l.Out, dy, l.Out, w, l.ldw(), 0, dx, l.In)
}

// weightGrad accumulates dW += xᵀ·dy (or dyᵀ·x for a transposed W) and
// db += Σ dy over rows rows.
func (l Linear) weightGrad(be backend.Backend, dw, db, x, dy []float32, rows int) {
	if l.Transposed {
		be.Matmul(true, false, l.Out, l.In, rows, dy, l.Out, x, l.In, 1, dw, l.In)
	} else {
		be.Matmul(true, false, l.In, l.Out, rows, x, l.In, dy, l.Out, 1, dw, l.Out)
	}
	if db != nil {
		be.BiasBackward(db, dy, rows, l.Out)
	}
}

// ColumnForward computes this rank's output features of a column-parallel
// layer: y (N×Out) = x·W + b with W and b this rank's columns. x is the
// full input (N×In), or with sequence parallelism this rank's rows of it,
// all-gathered first. b may be nil. No buffer may alias another, in this
// method or the other layers'.
func (g *Group) ColumnForward(ctx context.Context, l Linear, y, x, w, b []float32) error {
	const op = "column-parallel forward"
	lo, hi, err := g.SequenceRows(l.N)
	if err != nil {
		return err
	}
	if err := l.check(op, "y", hi-lo, l.N, x, y, w, b); err != nil {
		return err
	}
	xf, err := g.gather(ctx, 0, x, l.N, l.In)
	if err != nil {
		return fmt.Errorf("tensorpar: %s: all-gather of the input over tp: %w", op, err)
	}
	l.forward(g.be, y, xf, w, l.N)
	if b != nil {
		g.be.AddBias(y, b, l.N, l.Out)
	}
	return nil
}

// ColumnBackward is ColumnForward's backward: given dy (N×Out, this rank's
// output features) it accumulates dw += xᵀ·dy and db += Σ dy (db may be
// nil), and writes dx, the gradient of the input as ColumnForward took it
// (all rows, or this rank's rows with sequence parallelism). Every rank's
// dy·Wᵀ is a partial sum over its features: it is all-reduced over the
// group (reduce-scattered along the sequence with sequence parallelism,
// after all-gathering x again rather than keeping the full input from the
// forward). The reduction runs while the weight gradient is computed.
func (g *Group) ColumnBackward(ctx context.Context, l Linear, dx, dw, db, dy, x, w []float32) error {
	const op = "column-parallel backward"
	lo, hi, err := g.SequenceRows(l.N)
	if err != nil {
		return err
	}
	rows := hi - lo
	if err := errors.Join(l.check(op, "dy", rows, l.N, x, dy, w, db),
		checkLen(op, "dx", len(dx), rows*l.In), checkLen(op, "dw", len(dw), len(w))); err != nil {
		return err
	}
	xf, dxf := x, dx
	if g.sp && g.size > 1 {
		dxf = g.buf(1, l.N*l.In)
		h := g.comm.AllGatherAsync(ctx, comm.F32(x), comm.F32(g.buf(0, l.N*l.In)))
		l.inputGrad(g.be, dxf, dy, w, l.N)
		if err := wait(ctx, h); err != nil {
			return fmt.Errorf("tensorpar: %s: all-gather of the input over tp: %w", op, err)
		}
		xf = g.buf(0, l.N*l.In)
	} else {
		l.inputGrad(g.be, dxf, dy, w, l.N)
	}
	if g.size == 1 {
		l.weightGrad(g.be, dw, db, xf, dy, l.N)
		return nil
	}
	var h *comm.Handle
	if g.sp {
		h = g.comm.ReduceScatterAsync(ctx, comm.F32(dxf), comm.F32(dx), comm.Sum)
	} else {
		h = g.comm.AllReduceAsync(ctx, comm.F32(dx), comm.Sum)
	}
	l.weightGrad(g.be, dw, db, xf, dy, l.N)
	if err := wait(ctx, h); err != nil {
		return fmt.Errorf("tensorpar: %s: reduction of the input gradient over tp: %w", op, err)
	}
	return nil
}

// RowForward computes a row-parallel layer: every rank multiplies its
// input features x (N×In) by its rows W of the weight, the partial
// products are all-reduced (reduce-scattered along the sequence with
// sequence parallelism) into y, and b, whole on every rank, is added once,
// after the reduction. y is N×Out, or this rank's rows of it with sequence
// parallelism. b may be nil.
func (g *Group) RowForward(ctx context.Context, l Linear, y, x, w, b []float32) error {
	const op = "row-parallel forward"
	lo, hi, err := g.SequenceRows(l.N)
	if err != nil {
		return err
	}
	rows := hi - lo
	if err := l.check(op, "y", l.N, rows, x, y, w, b); err != nil {
		return err
	}
	switch {
	case g.size == 1:
		l.forward(g.be, y, x, w, l.N)
	case g.sp:
		yf := g.buf(0, l.N*l.Out)
		l.forward(g.be, yf, x, w, l.N)
		if err := g.comm.ReduceScatter(ctx, comm.F32(yf), comm.F32(y), comm.Sum); err != nil {
			return fmt.Errorf("tensorpar: %s: reduce-scatter of the output over tp: %w", op, err)
		}
	default:
		l.forward(g.be, y, x, w, l.N)
		if err := g.comm.AllReduce(ctx, comm.F32(y), comm.Sum); err != nil {
			return fmt.Errorf("tensorpar: %s: all-reduce of the output over tp: %w", op, err)
		}
	}
	if b != nil {
		g.be.AddBias(y, b, rows, l.Out)
	}
	return nil
}

// RowBackward is RowForward's backward: given dy as RowForward wrote y, it
// writes dx = dy·Wᵀ (N×In, this rank's features: no communication) and
// accumulates dw += xᵀ·dy and db += Σ dy. With sequence parallelism dy is
// all-gathered first; db is then summed over all rows, so it is the whole
// bias gradient on every rank, as without sequence parallelism.
func (g *Group) RowBackward(ctx context.Context, l Linear, dx, dw, db, dy, x, w []float32) error {
	const op = "row-parallel backward"
	lo, hi, err := g.SequenceRows(l.N)
	if err != nil {
		return err
	}
	if err := errors.Join(l.check(op, "dy", l.N, hi-lo, x, dy, w, db),
		checkLen(op, "dx", len(dx), l.N*l.In), checkLen(op, "dw", len(dw), len(w))); err != nil {
		return err
	}
	dyf, err := g.gather(ctx, 0, dy, l.N, l.Out)
	if err != nil {
		return fmt.Errorf("tensorpar: %s: all-gather of the output gradient over tp: %w", op, err)
	}
	l.inputGrad(g.be, dx, dyf, w, l.N)
	l.weightGrad(g.be, dw, db, x, dyf, l.N)
	return nil
}
