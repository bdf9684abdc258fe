package model

// ActivationUse is a model's activation memory in bytes, split the way the
// planner counts it (planner.ModelActivations with 4-byte elements and no
// dropout): what each recomputation mode keeps has one definition, and a
// test holds the engine's buffers to the planner's figures.
type ActivationUse struct {
	// Layers is what forward keeps in the blocks for backward: layers × the
	// planner's per-layer figure.
	Layers int64
	// Head is the final LayerNorm's input and output and the logits: the
	// planner's head.
	Head int64
	// Working is what recomputation rebuilds in backward, one block at a
	// time: the planner's working set.
	Working int64
	// Other is what Korthikanti et al.'s count, and so the planner, leaves
	// to the usable-memory margin: the LayerNorm means and reciprocal
	// deviations (2 floats per token per norm), the per-token losses, the
	// projection output consumed at once by the residual add, and
	// backward's activation gradients and attention scratch.
	Other int64
}

// Total is all of u.
func (u ActivationUse) Total() int64 { return u.Layers + u.Head + u.Working + u.Other }

// layerActs are the activations of one block that its backward pass needs.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd []float32
	qkv                   []float32
	atty                  []float32 // attention output, heads concatenated
	att                   []float32 // softmax probabilities (B, NH, T, T)
	res2                  []float32 // block input + attention projection
	ln2, ln2Mean, ln2Rstd []float32
	fch, fchGelu          []float32
}

// activations hold what forward keeps for backward, as Korthikanti et al.
// 2022 define the modes. None: every block's layerActs. Selective: every
// block's, but one att for all, recomputed in backward (the attention core:
// a·T² per sequence, the largest and cheapest to rebuild). Full: one
// layerActs, refilled per block, and the block inputs. The residual stream
// res[l] is block l's input, res[L] the final output.
type activations struct {
	layers  []layerActs
	res     [][]float32
	proj    []float32 // c_proj outputs, consumed at once by the residual add
	lnf     []float32
	lnfMean []float32
	lnfRstd []float32
	probs   []float32 // (N, V); the logits, then softmax, then their gradient
	losses  []float32
}

// floats allocates n float32s and counts their bytes in *part.
func floats(part *int64, n int) []float32 {
	*part += int64(n) * 4
	return make([]float32, n)
}

func newActivations(cfg Config, B, T int, rc Recompute, u *ActivationUse) activations {
	N, C, L := B*T, cfg.Embd, cfg.Layers
	var a activations
	// Where the blocks' buffers count: kept, or rebuilt per block by a full
	// recompute; a selective one rebuilds only the probabilities.
	kept, att, blocks := &u.Layers, &u.Layers, L
	switch rc {
	case RecomputeFull:
		kept, att, blocks = &u.Working, &u.Working, 1
	case RecomputeSelective:
		att = &u.Working
	}
	var shared []float32
	if rc != RecomputeNone {
		shared = floats(att, B*cfg.Heads*T*T)
	}
	for range blocks {
		la := layerActs{
			ln1: floats(kept, N*C), ln1Mean: floats(&u.Other, N), ln1Rstd: floats(&u.Other, N),
			qkv: floats(kept, N*3*C), atty: floats(kept, N*C), att: shared,
			res2: floats(kept, N*C), ln2: floats(kept, N*C), ln2Mean: floats(&u.Other, N), ln2Rstd: floats(&u.Other, N),
			fch: floats(kept, N*4*C), fchGelu: floats(kept, N*4*C),
		}
		if la.att == nil {
			la.att = floats(att, B*cfg.Heads*T*T)
		}
		a.layers = append(a.layers, la)
	}
	// Every mode keeps the block inputs (all that full keeps); the last
	// output is the final LayerNorm's input, part of the head.
	for range L {
		a.res = append(a.res, floats(&u.Layers, N*C))
	}
	a.res = append(a.res, floats(&u.Head, N*C))
	a.proj = floats(&u.Other, N*C)
	a.lnf, a.lnfMean, a.lnfRstd = floats(&u.Head, N*C), floats(&u.Other, N), floats(&u.Other, N)
	a.probs, a.losses = floats(&u.Head, N*cfg.Vocab), floats(&u.Other, N)
	return a
}

// layer returns the buffers block l uses.
func (a *activations) layer(l int) *layerActs {
	if len(a.layers) == 1 {
		return &a.layers[0]
	}
	return &a.layers[l]
}

// gradScratch holds the activation gradients of backward, shared by blocks.
type gradScratch struct {
	dres    []float32 // gradient of the residual stream at the current block boundary
	dln     []float32 // gradient into a LayerNorm output (N, C)
	dqkv    []float32
	datty   []float32
	dfch    []float32 // (N, 4C): into the GELU input
	dgelu   []float32 // (N, 4C): into the GELU output
	scratch []float32 // attention backward
}

func newGradScratch(cfg Config, B, T, attScratch int, u *ActivationUse) gradScratch {
	N, C := B*T, cfg.Embd
	o := &u.Other
	return gradScratch{
		dres: floats(o, N*C), dln: floats(o, N*C), dqkv: floats(o, N*3*C), datty: floats(o, N*C),
		dfch: floats(o, N*4*C), dgelu: floats(o, N*4*C), scratch: floats(o, attScratch),
	}
}

// ActivationUse is what m's activation buffers hold, by part: those kept by
// forward for backward, recomputation's and backward's scratch. Parameters
// and gradients are the store's to report.
func (m *Model) ActivationUse() ActivationUse { return m.use }

// ActivationBytes is the total of m's activation buffers (ActivationUse).
func (m *Model) ActivationBytes() int64 { return m.use.Total() }
