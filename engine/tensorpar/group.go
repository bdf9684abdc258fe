package tensorpar

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
)

// Group is one rank's view of its tensor-parallel group: the communicator
// the layers reduce and gather over, the backend that computes, and whether
// activations outside the TP regions are sequence-parallel. A Group holds
// scratch buffers, so one goroutine uses it at a time (a rank runs its
// layers in order anyway).
type Group struct {
	comm       *comm.Communicator
	be         backend.Backend
	sp         bool
	rank, size int
	scratch    [2][]float32
	idx        []int32
}

// NewGroup returns the group of c (nil: a group of one rank, which needs no
// communication) computing with be. sequenceParallel shards the activations
// between the TP regions along the sequence (see the package comment); with
// one rank it changes nothing.
func NewGroup(c *comm.Communicator, be backend.Backend, sequenceParallel bool) *Group {
	g := &Group{comm: c, be: be, sp: sequenceParallel, size: 1}
	if c != nil {
		g.rank, g.size = c.Rank(), c.Size()
	}
	return g
}

// Rank is this rank's index in the TP group.
func (g *Group) Rank() int { return g.rank }

// Size is the TP degree.
func (g *Group) Size() int { return g.size }

// SequenceParallel reports whether activations between the TP regions are
// sharded along the sequence.
func (g *Group) SequenceParallel() bool { return g.sp }

// Backend is the backend the layers compute with.
func (g *Group) Backend() backend.Backend { return g.be }

// VocabRange is the range [lo, hi) of a vocabulary of v tokens whose
// embedding rows and logits this rank owns: comm.Block(v, Rank, Size).
func (g *Group) VocabRange(v int) (lo, hi int) { return comm.Block(v, g.rank, g.size) }

// SequenceRows is the range [lo, hi) of the n = B·T token rows that this
// rank holds of a sequence-parallel activation: its n/Size contiguous rows
// with sequence parallelism, all of them without. n must then divide by
// the TP degree, as Megatron requires of the sequence length, so that the
// row blocks are comm's blocks of the n·C elements.
func (g *Group) SequenceRows(n int) (lo, hi int, err error) {
	if !g.sp || g.size == 1 {
		return 0, n, nil
	}
	if n%g.size != 0 {
		return 0, 0, fmt.Errorf("tensorpar: sequence parallelism: %d tokens (batch × sequence) do not divide by tp %d: choose a sequence length or micro-batch that does, or turn sequence_parallel off", n, g.size)
	}
	return g.rank * n / g.size, (g.rank + 1) * n / g.size, nil
}

// ReduceReplicated sums over the TP group the gradient of a parameter that
// every TP rank holds whole but, under sequence parallelism, computes from
// its own rows only (LayerNorm's weight and bias): afterwards every rank
// holds the full gradient. Without sequence parallelism each rank already
// has the whole gradient from the whole (replicated) activation, and it
// does nothing. The layers of this package never leave such partial
// gradients: their replicated biases and the position embedding are
// differentiated from gathered rows.
func (g *Group) ReduceReplicated(ctx context.Context, grad []float32) error {
	if !g.sp || g.size == 1 {
		return nil
	}
	if err := g.comm.AllReduce(ctx, comm.F32(grad), comm.Sum); err != nil {
		return fmt.Errorf("tensorpar: all-reduce of a replicated gradient over tp: %w", err)
	}
	return nil
}

// buf returns scratch buffer i with n elements (contents undefined).
func (g *Group) buf(i, n int) []float32 {
	if cap(g.scratch[i]) < n {
		g.scratch[i] = make([]float32, n)
	}
	return g.scratch[i][:n]
}

// gather all-gathers the sequence shards x (rows×width) into the n×width
// full activation, returned in scratch buffer i; without sequence
// parallelism x is that already.
func (g *Group) gather(ctx context.Context, i int, x []float32, n, width int) ([]float32, error) {
	if !g.sp || g.size == 1 {
		return x, nil
	}
	full := g.buf(i, n*width)
	if err := g.comm.AllGather(ctx, comm.F32(x), comm.F32(full)); err != nil {
		return nil, err
	}
	return full, nil
}

// wait waits for h to finish and returns its error. It does not stop at
// ctx's end: h's buffers are in use until the operation ends, which it does
// by ctx or the communicator's timeout.
func wait(ctx context.Context, h *comm.Handle) error {
	return h.Wait(context.WithoutCancel(ctx))
}

// checkLen is the error for a buffer of the wrong size, or nil.
func checkLen(op, name string, got, want int) error {
	if got != want {
		return fmt.Errorf("tensorpar: %s: %s has %d elements, want %d", op, name, got, want)
	}
	return nil
}
