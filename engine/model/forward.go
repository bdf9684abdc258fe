package model

import "fmt"

// Forward runs the model on a micro-batch: x holds B×T input tokens, y the
// B×T targets (x shifted by one). It returns the mean cross-entropy loss
// and keeps what Backward needs.
func (m *Model) Forward(x, y []int32) (float32, error) {
	if err := m.checkBatch(x, y); err != nil {
		return 0, err
	}
	m.x, m.y = x, y
	cfg, a, st := m.Config, &m.acts, m.store
	N, C, V, L := m.B*m.T, cfg.Embd, cfg.Vocab, cfg.Layers
	emb := m.embWeights()
	st.Prefetch(1)
	if emb.wte16 != nil {
		m.bw.EncoderBF16(a.res[0], x, emb.wte16, emb.wpe16, m.B, m.T, C)
	} else {
		m.be.Encoder(a.res[0], x, emb.wte, emb.wpe, m.B, m.T, C)
	}
	st.Release(0)
	for l := range L {
		lw := m.blockWeights(1 + l)
		st.Prefetch(2 + l)
		m.blockForward(&lw, a.layer(l), a.res[l], a.res[l+1])
		st.Release(1 + l)
	}
	lnfw, lnfb := cfg.finalView(st.Weights(L + 1))
	st.Prefetch(0)
	m.be.LayerNorm(a.lnf, a.lnfMean, a.lnfRstd, a.res[L], lnfw, lnfb, N, C)
	st.Release(L + 1)
	// The output layer is the token embedding, transposed (weight tying).
	emb = m.embWeights()
	m.matmulW(true, N, V, C, a.lnf, C, emb.wte, emb.wte16, C, a.probs, V)
	st.Release(0)
	m.be.CrossEntropy(a.losses, a.probs, a.probs, y, N, V)
	var sum float64
	for _, l := range a.losses {
		sum += float64(l)
	}
	return float32(sum / float64(N)), nil
}

// checkBatch rejects a micro-batch of the wrong size or with a token outside
// the vocabulary, which would otherwise index past the embedding.
func (m *Model) checkBatch(x, y []int32) error {
	N := m.B * m.T
	if len(x) != N || len(y) != N {
		return fmt.Errorf("model: micro-batch of %d inputs and %d targets: want %d×%d = %d of each", len(x), len(y), m.B, m.T, N)
	}
	for i := range N {
		if uint32(x[i]) >= uint32(m.Config.Vocab) || uint32(y[i]) >= uint32(m.Config.Vocab) {
			return fmt.Errorf("model: token %d/%d at position %d is outside the vocabulary of %d: does the data match the model's vocab?", x[i], y[i], i, m.Config.Vocab)
		}
	}
	return nil
}

// blockForward computes a block with weights lw: out = res2 +
// MLP(LN2(res2)) with res2 = in + Attention(LN1(in)).
func (m *Model) blockForward(lw *layerWeights, la *layerActs, in, out []float32) {
	be, proj := m.be, m.acts.proj
	N, C, B, T, NH := m.B*m.T, m.Config.Embd, m.B, m.T, m.Config.Heads
	be.LayerNorm(la.ln1, la.ln1Mean, la.ln1Rstd, in, lw.ln1w, lw.ln1b, N, C)
	m.matmulW(false, N, 3*C, C, la.ln1, C, lw.qkvw, lw.qkvw16, 3*C, la.qkv, 3*C)
	be.AddBias(la.qkv, lw.qkvb, N, 3*C)
	be.Attention(la.atty, la.att, la.qkv, B, T, C, NH)
	m.matmulW(false, N, C, C, la.atty, C, lw.attprojw, lw.attprojw16, C, proj, C)
	be.AddBias(proj, lw.attprojb, N, C)
	be.Residual(la.res2, in, proj)
	be.LayerNorm(la.ln2, la.ln2Mean, la.ln2Rstd, la.res2, lw.ln2w, lw.ln2b, N, C)
	m.matmulW(false, N, 4*C, C, la.ln2, C, lw.fcw, lw.fcw16, 4*C, la.fch, 4*C)
	be.AddBias(la.fch, lw.fcb, N, 4*C)
	be.Gelu(la.fchGelu, la.fch)
	m.matmulW(false, N, C, 4*C, la.fchGelu, 4*C, lw.fcprojw, lw.fcprojw16, C, proj, C)
	be.AddBias(proj, lw.fcprojb, N, C)
	be.Residual(out, la.res2, proj)
}

// Backward accumulates into the store's gradients dloss × the gradient of
// the mean loss of the last Forward. dloss is 1 for one micro-batch per step
// and 1/n when n micro-batches accumulate into one step.
func (m *Model) Backward(dloss float32) {
	cfg, a, gs, st := m.Config, &m.acts, &m.grad, m.store
	N, C, V, L := m.B*m.T, cfg.Embd, cfg.Vocab, cfg.Layers
	m.be.CrossEntropyBackward(a.probs, a.probs, m.y, dloss/float32(N), N, V)
	emb := m.embWeights()
	st.Prefetch(L + 1)
	g0, beta := m.grads(0)
	gwte, gwpe := cfg.embView(g0)
	if beta == 0 { // EncoderBackward adds into wpe; the matmul writes wte
		clear(gwpe)
	}
	m.be.Matmul(true, false, V, C, N, a.probs, V, a.lnf, C, beta, gwte, C)
	m.matmulW(false, N, C, V, a.probs, V, emb.wte, emb.wte16, C, gs.dln, C)
	st.Release(0)
	lnfw, _ := cfg.finalView(st.Weights(L + 1))
	st.Prefetch(L)
	glnfw, glnfb := cfg.finalView(st.Grads(L + 1))
	clear(gs.dres)
	m.be.LayerNormBackward(gs.dres, glnfw, glnfb, gs.dln, a.res[L], lnfw, a.lnfMean, a.lnfRstd, N, C)
	st.GradsDone(L + 1)
	st.Release(L + 1)
	for l := L - 1; l >= 0; l-- {
		la := a.layer(l)
		lw := m.blockWeights(1 + l)
		if l > 0 {
			st.Prefetch(l)
		}
		switch m.Recompute {
		case RecomputeFull:
			// Rewrites res[l+1] with the bit-identical values it holds.
			m.blockForward(&lw, la, a.res[l], a.res[l+1])
		case RecomputeSelective:
			// Rebuilds block l's probabilities in the shared buffer from
			// its kept Q, K and V, rewriting atty with the bit-identical
			// values it holds (the kernel computes both at once).
			m.be.Attention(la.atty, la.att, la.qkv, m.B, m.T, C, cfg.Heads)
		}
		g, beta := m.grads(1 + l)
		gw := cfg.blockView(g)
		if beta == 0 {
			gw.clearVectors()
		}
		m.blockBackward(&lw, &gw, la, a.res[l], beta)
		st.GradsDone(1 + l)
		st.Release(1 + l)
	}
	m.be.EncoderBackward(gwte, gwpe, gs.dres, m.x, m.B, m.T, C)
	st.GradsDone(0)
}

// blockBackward turns gs.dres from the gradient of a block's output into
// the gradient of its input, accumulating the block's weight gradients
// into gw, or writing its matrices' with beta 0 (see grads).
func (m *Model) blockBackward(lw, gw *layerWeights, la *layerActs, in []float32, beta float32) {
	be, gs := m.be, &m.grad
	N, C, B, T, NH := m.B*m.T, m.Config.Embd, m.B, m.T, m.Config.Heads
	dres := gs.dres
	// out = res2 + c_proj(gelu(c_fc(LN2(res2))))
	be.Matmul(true, false, 4*C, C, N, la.fchGelu, 4*C, dres, C, beta, gw.fcprojw, C)
	be.BiasBackward(gw.fcprojb, dres, N, C)
	m.matmulW(true, N, 4*C, C, dres, C, lw.fcprojw, lw.fcprojw16, C, gs.dgelu, 4*C)
	clear(gs.dfch)
	be.GeluBackward(gs.dfch, la.fch, gs.dgelu)
	be.Matmul(true, false, C, 4*C, N, la.ln2, C, gs.dfch, 4*C, beta, gw.fcw, 4*C)
	be.BiasBackward(gw.fcb, gs.dfch, N, 4*C)
	m.matmulW(true, N, C, 4*C, gs.dfch, 4*C, lw.fcw, lw.fcw16, 4*C, gs.dln, C)
	be.LayerNormBackward(dres, gw.ln2w, gw.ln2b, gs.dln, la.res2, lw.ln2w, la.ln2Mean, la.ln2Rstd, N, C)
	// res2 = in + c_proj(attention(c_attn(LN1(in))))
	be.Matmul(true, false, C, C, N, la.atty, C, dres, C, beta, gw.attprojw, C)
	be.BiasBackward(gw.attprojb, dres, N, C)
	m.matmulW(true, N, C, C, dres, C, lw.attprojw, lw.attprojw16, C, gs.datty, C)
	clear(gs.dqkv)
	be.AttentionBackward(gs.dqkv, gs.datty, la.qkv, la.att, gs.scratch, B, T, C, NH)
	be.Matmul(true, false, C, 3*C, N, la.ln1, C, gs.dqkv, 3*C, beta, gw.qkvw, 3*C)
	be.BiasBackward(gw.qkvb, gs.dqkv, N, 3*C)
	m.matmulW(true, N, C, 3*C, gs.dqkv, 3*C, lw.qkvw, lw.qkvw16, 3*C, gs.dln, C)
	be.LayerNormBackward(dres, gw.ln1w, gw.ln1b, gs.dln, in, lw.ln1w, la.ln1Mean, la.ln1Rstd, N, C)
}

// embedding is the embedding unit as the model uses it: bfloat16 bits in
// place (wte16, wpe16) or float32 (wte, wpe).
type embedding struct {
	wte, wpe     []float32
	wte16, wpe16 []uint16
}

// embWeights gets the embedding unit (see weights16).
func (m *Model) embWeights() embedding {
	n := m.Config.Vocab * m.Config.Embd
	if h := m.weights16(0); h != nil {
		return embedding{wte16: h[:n:n], wpe16: h[n:]}
	}
	wte, wpe := m.Config.embView(m.store.Weights(0))
	return embedding{wte: wte, wpe: wpe}
}

// blockWeights gets block unit u (see weights16).
func (m *Model) blockWeights(u int) layerWeights {
	if h := m.weights16(u); h != nil {
		return m.Config.blockViewBF16(h, m.vec)
	}
	return m.Config.blockView(m.store.Weights(u))
}

// weights16 is unit u's bfloat16 working parameters in place, when the
// store lends them and the backend multiplies by them; else nil, and the
// caller asks the store for float32.
func (m *Model) weights16(u int) []uint16 {
	if m.st16 == nil {
		return nil
	}
	return m.st16.WeightsBF16(u)
}

// matmulW computes c = a·op(W) for a weight matrix W: w16 in place when
// set (bfloat16), else w.
func (m *Model) matmulW(transB bool, M, N, K int, a []float32, lda int, w []float32, w16 []uint16, ldb int, c []float32, ldc int) {
	if w16 != nil {
		m.bw.MatmulBF16B(false, transB, M, N, K, a, lda, w16, ldb, 0, c, ldc)
		return
	}
	m.be.Matmul(false, transB, M, N, K, a, lda, w, ldb, 0, c, ldc)
}

// grads gets unit u's gradient buffer and the beta of the matmuls that
// produce its weight matrices' gradients: a buffer to write (beta 0, the
// rest cleared by the caller) where the store lends one (GradsWriter),
// else one to add to (beta 1).
func (m *Model) grads(u int) ([]float32, float32) {
	if m.gw != nil {
		if g := m.gw.GradsWrite(u); g != nil {
			return g, 0
		}
	}
	return m.store.Grads(u), 1
}
