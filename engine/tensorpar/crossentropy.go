package tensorpar

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
)

// checkCE validates a vocab-parallel cross-entropy's arguments.
func (g *Group) checkCE(op string, probs, logits []float32, targets []int32, N, V int) error {
	if N < 1 || V < g.size {
		return fmt.Errorf("tensorpar: %s: %d rows of a vocabulary of %d: need a row and at least tp = %d tokens", op, N, V, g.size)
	}
	lo, hi := g.VocabRange(V)
	err := errors.Join(checkLen(op, "the logits shard", len(logits), N*(hi-lo)),
		checkLen(op, "the probabilities shard", len(probs), N*(hi-lo)),
		checkLen(op, "the targets", len(targets), N))
	if err != nil {
		return err
	}
	for i, t := range targets {
		if t < 0 || int(t) >= V {
			return fmt.Errorf("tensorpar: %s: target %d at position %d is outside the vocabulary of %d: does the data match the model's vocab?", op, t, i, V)
		}
	}
	return nil
}

// CrossEntropy computes losses[n] = −log softmax(z[n])[targets[n]] for the
// N rows of the N×V logits z, of which every rank holds its columns
// VocabRange(V) (logits, N×(hi−lo)), without gathering them: Megatron's
// vocab_parallel_cross_entropy. It leaves in probs (which may alias logits)
// this rank's columns of the softmax, for CrossEntropyBackward.
//
// Per row, with m_r, S_r the local maximum and Σ exp(z−m_r) over the
// shard: m = max_r m_r (all-reduce max); then one all-reduce sums
// S_r·exp(m_r−m) into S = Σ exp(z−m) and the target's logit z_t (one rank
// contributes it, the others zero); loss = log S − (z_t − m). The local
// softmax exp(z−m_r)/S_r comes from the backend's dense kernel, run on the
// shard while the maximum is reduced, and is rescaled by S_r·exp(m_r−m)/S.
// The kernel gives log S_r as the loss of a row whose target is the
// shard's argmax.
func (g *Group) CrossEntropy(ctx context.Context, losses, probs, logits []float32, targets []int32, N, V int) error {
	const op = "vocab-parallel cross-entropy"
	if err := errors.Join(g.checkCE(op, probs, logits, targets, N, V), checkLen(op, "losses", len(losses), N)); err != nil {
		return err
	}
	if g.size == 1 {
		g.be.CrossEntropy(losses, probs, logits, targets, N, V)
		return nil
	}
	lo, hi := g.VocabRange(V)
	W := hi - lo
	mx := g.buf(0, 2*N) // local maxima, then the group's
	sums := g.buf(1, 3*N)
	logS, es, zt := sums[:N], sums[N:2*N], sums[2*N:]
	if cap(g.idx) < N {
		g.idx = make([]int32, N)
	}
	arg := g.idx[:N]
	for n := range N {
		row := logits[n*W : (n+1)*W]
		arg[n] = argmax(row)
		mx[n] = row[arg[n]]
		zt[n] = 0 // read before probs, which may alias logits, is written
		if t := int(targets[n]); t >= lo && t < hi {
			zt[n] = row[t-lo]
		}
	}
	copy(mx[N:], mx[:N])
	h := g.comm.AllReduceAsync(ctx, comm.F32(mx[N:]), comm.Max)
	g.be.CrossEntropy(logS, probs, logits, arg, N, W)
	if err := wait(ctx, h); err != nil {
		return fmt.Errorf("tensorpar: %s: all-reduce of the row maxima over tp: %w", op, err)
	}
	m := mx[N:]
	for n := range N {
		es[n] = float32(math.Exp(float64(logS[n]) + float64(mx[n]) - float64(m[n])))
	}
	if err := g.comm.AllReduce(ctx, comm.F32(sums[N:]), comm.Sum); err != nil {
		return fmt.Errorf("tensorpar: %s: all-reduce of the sums of exponentials over tp: %w", op, err)
	}
	for n := range N {
		S := float64(es[n])
		losses[n] = float32(math.Log(S) - (float64(zt[n]) - float64(m[n])))
		f := float32(math.Exp(float64(logS[n])+float64(mx[n])-float64(m[n])) / S)
		p := probs[n*W : (n+1)*W]
		for i := range p {
			p[i] *= f
		}
	}
	return nil
}

// argmax returns the index of the first largest element of row (not
// empty); with NaNs its answer is arbitrary, and the NaN reaches the loss
// through the kernel's sum.
func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

// CrossEntropyBackward writes this rank's columns of dlogits = (softmax −
// onehot(targets))·dloss from CrossEntropy's probs (dlogits may alias
// probs), dloss being the gradient of the total loss with respect to each
// row's loss (1/N for a mean), as the dense kernel does. It needs no
// communication: each rank subtracts the one-hot only in the rows whose
// target it owns.
func (g *Group) CrossEntropyBackward(dlogits, probs []float32, targets []int32, dloss float32, N, V int) error {
	const op = "vocab-parallel cross-entropy backward"
	if err := g.checkCE(op, dlogits, probs, targets, N, V); err != nil {
		return err
	}
	lo, hi := g.VocabRange(V)
	W := hi - lo
	for n := range N {
		p, d := probs[n*W:(n+1)*W], dlogits[n*W:(n+1)*W]
		t := int(targets[n]) - lo
		var pt float32
		if t >= 0 && t < W {
			pt = p[t] // read before d, which may alias p, is written
		}
		for i, v := range p {
			d[i] = v * dloss
		}
		if t >= 0 && t < W {
			d[t] = (pt - 1) * dloss
		}
	}
	return nil
}
