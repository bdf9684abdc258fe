package model

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/tensorpar"
)

// checkPass validates a Forward's or Backward's arguments on one chunk: a
// buffer from the previous (next) stage exactly where there is one.
func (s *Stage) checkPass(op string, prev, next []float32) error {
	n := s.dims.rows * s.Config.Embd
	var err error
	for _, b := range []struct {
		buf  []float32
		none bool
		what string
	}{{prev, s.dims.isFirst, "from the previous stage"}, {next, s.dims.isLast, "for the next stage"}} {
		switch {
		case b.none && b.buf != nil:
			err = errors.Join(err, fmt.Errorf("a buffer %s, which this stage has not", b.what))
		case !b.none && len(b.buf) != n:
			err = errors.Join(err, fmt.Errorf("a buffer %s of %d elements, want %d", b.what, len(b.buf), n))
		}
	}
	if err != nil {
		return fmt.Errorf("model: stage %d of %d: %s: %w", s.index, s.stages, op, err)
	}
	return nil
}

// InputLen is the length of the activation entering the stage (and of
// the gradient it returns): this rank's token rows × the width.
func (s *Stage) InputLen(int) int { return s.dims.rows * s.Config.Embd }

// OutputLen is the length of the activation the stage passes on: the
// same as its input's.
func (s *Stage) OutputLen(int) int { return s.dims.rows * s.Config.Embd }

// Forward runs micro-batch micro through the stage's model chunk chunk (0
// unless interleaved): from the embedding of its tokens (first virtual
// stage) or in, through the chunk's blocks, into out or (last virtual
// stage) the loss, which Losses records.
func (s *Stage) Forward(ctx context.Context, chunk, micro int, in, out []float32) error {
	if chunk != 0 {
		c, err := s.chunkAt("forward", chunk)
		if err != nil {
			return err
		}
		return c.Forward(ctx, 0, micro, in, out)
	}
	if err := s.checkPass("forward", in, out); err != nil {
		return err
	}
	a, err := s.take(micro)
	if err != nil {
		return err
	}
	if err := s.forward(ctx, micro, a, in, out); err != nil {
		s.release(micro)
		return fmt.Errorf("model: stage %d: forward of micro-batch %d: %w", s.index, micro, err)
	}
	return nil
}

func (s *Stage) forward(ctx context.Context, micro int, a *stageActs, in, out []float32) error {
	d, cfg := s.dims, s.Config
	if err := s.feed(micro, a); err != nil {
		return err
	}
	if d.isFirst {
		e := tensorpar.Embedding{B: s.B, T: s.T, C: cfg.Embd, V: cfg.Vocab}
		if err := s.tp.EmbeddingForward(ctx, e, a.res[0], a.x, s.w.wte, s.w.wpe); err != nil {
			return err
		}
	} else {
		a.res[0] = in
	}
	for i := range d.layers {
		dst := a.res[i+1]
		if i == d.layers-1 && !d.isLast {
			dst = out
		}
		if err := s.blockForward(ctx, &s.w.blocks[i], s.layer(a, i), a.res[i], dst); err != nil {
			return fmt.Errorf("block %d: %w", s.first+i, err)
		}
	}
	if !d.isLast {
		return nil
	}
	loss, err := s.headForward(ctx, a)
	if err != nil {
		return err
	}
	s.record(micro, loss)
	return nil
}

// feed copies micro's tokens that the stage reads: the inputs on the
// first stage, the targets on the last.
func (s *Stage) feed(micro int, a *stageActs) error {
	if !s.dims.isFirst && !s.dims.isLast {
		return nil
	}
	x, y, err := s.batch(micro)
	if err != nil {
		return fmt.Errorf("read the micro-batch: %w", err)
	}
	if len(x) != s.dims.N || len(y) != s.dims.N {
		return fmt.Errorf("micro-batch of %d inputs and %d targets: want %d×%d = %d of each", len(x), len(y), s.B, s.T, s.dims.N)
	}
	copy(a.x, x) // a.x and a.y are nil where the stage does not read them
	copy(a.y, y)
	return nil
}

// headForward computes the last stage's loss: the final LayerNorm on this
// rank's rows, the tied output layer as a column-parallel layer giving this
// rank's vocabulary range of the logits, and the vocab-parallel
// cross-entropy. It returns the mean over the micro-batch's tokens.
func (s *Stage) headForward(ctx context.Context, a *stageActs) (float32, error) {
	d, cfg := s.dims, s.Config
	s.be.LayerNorm(a.lnf, a.lnfMean, a.lnfRstd, a.res[d.layers], s.w.lnfw, s.w.lnfb, d.rows, cfg.Embd)
	if err := s.tp.ColumnForward(ctx, s.lin.head, a.probs, a.lnf, s.w.wte, nil); err != nil {
		return 0, fmt.Errorf("output layer: %w", err)
	}
	if err := s.tp.CrossEntropy(ctx, a.losses, a.probs, a.probs, a.y, d.N, cfg.Vocab); err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range a.losses {
		sum += float64(l)
	}
	return float32(sum / float64(d.N)), nil
}

// blockForward computes a block on this rank's heads and MLP features:
// out = res2 + MLP(LN2(res2)) with res2 = in + Attention(LN1(in)), the
// LayerNorms and residual adds on this rank's rows (all of them without
// sequence parallelism). With out nil (a full recomputation, whose
// backward needs the activations but not the output) it stops after the
// GELU: every TP rank of the block skips the same reduction.
func (s *Stage) blockForward(ctx context.Context, lw *layerWeights, la *layerActs, in, out []float32) error {
	be, g, proj := s.be, s.tp, s.sc.proj
	d, C := s.dims, s.Config.Embd
	be.LayerNorm(la.ln1, la.ln1Mean, la.ln1Rstd, in, lw.ln1w, lw.ln1b, d.rows, C)
	if err := g.ColumnForward(ctx, s.lin.qkv, la.qkv, la.ln1, lw.qkvw, lw.qkvb); err != nil {
		return err
	}
	be.Attention(la.atty, la.att, la.qkv, s.B, s.T, d.cw, d.nh)
	if err := g.RowForward(ctx, s.lin.attProj, proj, la.atty, lw.attprojw, lw.attprojb); err != nil {
		return err
	}
	be.Residual(la.res2, in, proj)
	be.LayerNorm(la.ln2, la.ln2Mean, la.ln2Rstd, la.res2, lw.ln2w, lw.ln2b, d.rows, C)
	if err := g.ColumnForward(ctx, s.lin.fc, la.fch, la.ln2, lw.fcw, lw.fcb); err != nil {
		return err
	}
	be.Gelu(la.fchGelu, la.fch)
	if out == nil {
		return nil
	}
	if err := g.RowForward(ctx, s.lin.fcProj, proj, la.fchGelu, lw.fcprojw, lw.fcprojb); err != nil {
		return err
	}
	be.Residual(out, la.res2, proj)
	return nil
}

// Backward runs micro-batch micro back through the stage's model chunk
// chunk: from its loss (last virtual stage, scaled by DLoss) or dout,
// through the chunk's blocks, into the embeddings' gradients (first
// virtual stage) or din, accumulating the parameters' gradients.
func (s *Stage) Backward(ctx context.Context, chunk, micro int, dout, din []float32) error {
	if chunk != 0 {
		c, err := s.chunkAt("backward", chunk)
		if err != nil {
			return err
		}
		c.DLoss = s.DLoss // the trainer sets it on the rank's Stage
		return c.Backward(ctx, 0, micro, dout, din)
	}
	if err := s.checkPass("backward", din, dout); err != nil {
		return err
	}
	a, ok := s.inflight[micro]
	if !ok {
		return fmt.Errorf("model: stage %d: backward of micro-batch %d, whose forward has not run", s.index, micro)
	}
	defer s.release(micro)
	if err := s.backward(ctx, a, dout, din); err != nil {
		return fmt.Errorf("model: stage %d: backward of micro-batch %d: %w", s.index, micro, err)
	}
	return nil
}

func (s *Stage) backward(ctx context.Context, a *stageActs, dout, din []float32) error {
	d, cfg, sc := s.dims, s.Config, &s.sc
	if d.isLast {
		if err := s.headBackward(ctx, a); err != nil {
			return err
		}
	} else {
		copy(sc.dres, dout)
	}
	for i := d.layers - 1; i >= 0; i-- {
		la, err := s.recompute(ctx, a, i)
		if err == nil {
			err = s.blockBackward(ctx, &s.w.blocks[i], &s.g.blocks[i], la, a.res[i])
		}
		if err != nil {
			return fmt.Errorf("block %d: %w", s.first+i, err)
		}
	}
	if !d.isFirst {
		copy(din, sc.dres)
		return nil
	}
	e := tensorpar.Embedding{B: s.B, T: s.T, C: cfg.Embd, V: cfg.Vocab}
	return s.tp.EmbeddingBackward(ctx, e, s.g.wte, s.g.wpe, sc.dres, a.x)
}

// recompute rebuilds what the forward of block i of a dropped, just
// before the block's backward, and returns the block's activations. Full:
// the whole block, from its kept input, into the shared set. Selective:
// the probabilities, into the shared buffer, from the kept Q, K and V
// (rewriting atty with the values it holds: the kernel computes both).
// The same kernels on the same inputs (and, under full, the same
// collectives over the same TP ranks) give bit-identical values, so the
// gradients are those of a run that kept everything.
func (s *Stage) recompute(ctx context.Context, a *stageActs, i int) (*layerActs, error) {
	switch s.rc {
	case RecomputeFull:
		return &s.work, s.blockForward(ctx, &s.w.blocks[i], &s.work, a.res[i], nil)
	case RecomputeSelective:
		la := &a.layers[i]
		s.be.Attention(la.atty, la.att, la.qkv, s.B, s.T, s.dims.cw, s.dims.nh)
		return la, nil
	}
	return &a.layers[i], nil
}

// headBackward leaves in sc.dres the gradient of DLoss × the micro-batch's
// mean loss with respect to the final LayerNorm's input, accumulating the
// output layer's (tied embedding's) and the LayerNorm's gradients.
func (s *Stage) headBackward(ctx context.Context, a *stageActs) error {
	d, cfg, sc := s.dims, s.Config, &s.sc
	if err := s.tp.CrossEntropyBackward(a.probs, a.probs, a.y, s.DLoss/float32(d.N), d.N, cfg.Vocab); err != nil {
		return err
	}
	if err := s.tp.ColumnBackward(ctx, s.lin.head, sc.dln, s.g.wte, nil, a.probs, a.lnf, s.w.wte); err != nil {
		return fmt.Errorf("output layer: %w", err)
	}
	clear(sc.dres)
	s.be.LayerNormBackward(sc.dres, s.g.lnfw, s.g.lnfb, sc.dln, a.res[d.layers], s.w.lnfw, a.lnfMean, a.lnfRstd, d.rows, cfg.Embd)
	return nil
}

// blockBackward turns sc.dres from the gradient of a block's output into
// that of its input (this rank's rows), accumulating the block's
// parameter gradients into gw: blockForward's steps in reverse, each TP
// layer's backward doing its reduction.
func (s *Stage) blockBackward(ctx context.Context, lw, gw *layerWeights, la *layerActs, in []float32) error {
	be, g, sc := s.be, s.tp, &s.sc
	d, C := s.dims, s.Config.Embd
	// out = res2 + c_proj(gelu(c_fc(LN2(res2))))
	if err := g.RowBackward(ctx, s.lin.fcProj, sc.dgelu, gw.fcprojw, gw.fcprojb, sc.dres, la.fchGelu, lw.fcprojw); err != nil {
		return err
	}
	clear(sc.dfch)
	be.GeluBackward(sc.dfch, la.fch, sc.dgelu)
	if err := g.ColumnBackward(ctx, s.lin.fc, sc.dln, gw.fcw, gw.fcb, sc.dfch, la.ln2, lw.fcw); err != nil {
		return err
	}
	be.LayerNormBackward(sc.dres, gw.ln2w, gw.ln2b, sc.dln, la.res2, lw.ln2w, la.ln2Mean, la.ln2Rstd, d.rows, C)
	// res2 = in + c_proj(attention(c_attn(LN1(in))))
	if err := g.RowBackward(ctx, s.lin.attProj, sc.datty, gw.attprojw, gw.attprojb, sc.dres, la.atty, lw.attprojw); err != nil {
		return err
	}
	clear(sc.dqkv)
	be.AttentionBackward(sc.dqkv, sc.datty, la.qkv, la.att, sc.att, s.B, s.T, d.cw, d.nh)
	if err := g.ColumnBackward(ctx, s.lin.qkv, sc.dln, gw.qkvw, gw.qkvb, sc.dqkv, la.ln1, lw.qkvw); err != nil {
		return err
	}
	be.LayerNormBackward(sc.dres, gw.ln1w, gw.ln1b, sc.dln, in, lw.ln1w, la.ln1Mean, la.ln1Rstd, d.rows, C)
	return nil
}
