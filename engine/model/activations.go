package model

import "fmt"

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

// sizer allocates the activation buffers and counts their bytes by part;
// a dry one only counts, so that a job's memory is known before it is
// allocated (ActivationUseOf) by the code that allocates it.
type sizer struct {
	use ActivationUse
	dry bool
}

// floats allocates n float32s, counted in *part (a field of z.use).
func (z *sizer) floats(part *int64, n int) []float32 {
	*part += int64(n) * 4
	if z.dry {
		return nil
	}
	return make([]float32, n)
}

func newActivations(cfg Config, B, T int, rc Recompute, z *sizer) activations {
	N, C, L, u := B*T, cfg.Embd, cfg.Layers, &z.use
	var a activations
	// Where the blocks' buffers count: kept, or rebuilt per block by a full
	// recompute; a selective one rebuilds only the probabilities, in one
	// buffer shared by the blocks.
	kept, att, blocks := &u.Layers, &u.Layers, L
	switch rc {
	case RecomputeFull:
		kept, att, blocks = &u.Working, &u.Working, 1
	case RecomputeSelective:
		att = &u.Working
	}
	var shared []float32
	if rc == RecomputeSelective {
		shared = z.floats(att, B*cfg.Heads*T*T)
	}
	for range blocks {
		la := layerActs{
			ln1: z.floats(kept, N*C), ln1Mean: z.floats(&u.Other, N), ln1Rstd: z.floats(&u.Other, N),
			qkv: z.floats(kept, N*3*C), atty: z.floats(kept, N*C), att: shared,
			res2: z.floats(kept, N*C), ln2: z.floats(kept, N*C), ln2Mean: z.floats(&u.Other, N), ln2Rstd: z.floats(&u.Other, N),
			fch: z.floats(kept, N*4*C), fchGelu: z.floats(kept, N*4*C),
		}
		if rc != RecomputeSelective {
			la.att = z.floats(att, B*cfg.Heads*T*T)
		}
		a.layers = append(a.layers, la)
	}
	// Every mode keeps the block inputs (all that full keeps); the last
	// output is the final LayerNorm's input, part of the head.
	for range L {
		a.res = append(a.res, z.floats(&u.Layers, N*C))
	}
	a.res = append(a.res, z.floats(&u.Head, N*C))
	a.proj = z.floats(&u.Other, N*C)
	a.lnf, a.lnfMean, a.lnfRstd = z.floats(&u.Head, N*C), z.floats(&u.Other, N), z.floats(&u.Other, N)
	a.probs, a.losses = z.floats(&u.Head, N*cfg.Vocab), z.floats(&u.Other, N)
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

func newGradScratch(cfg Config, B, T, attScratch int, z *sizer) gradScratch {
	N, C, o := B*T, cfg.Embd, &z.use.Other
	return gradScratch{
		dres: z.floats(o, N*C), dln: z.floats(o, N*C), dqkv: z.floats(o, N*3*C), datty: z.floats(o, N*C),
		dfch: z.floats(o, N*4*C), dgelu: z.floats(o, N*4*C), scratch: z.floats(o, attScratch),
	}
}

// maxBufferFloats bounds one activation buffer (4 TiB, beyond any host) so
// that every size computed from a shape stays far inside an int64.
const maxBufferFloats = 1 << 40

// ActivationUseOf is what New allocates for activations for cfg,
// micro-batches of B×T tokens, rc, and a backend whose AttentionScratch(T)
// is attScratch; computed by the code that allocates, without allocating,
// so that a job can be checked against memory before it is built.
func ActivationUseOf(cfg Config, B, T int, rc Recompute, attScratch int) (ActivationUse, error) {
	if err := checkShape(cfg, B, T); err != nil {
		return ActivationUse{}, err
	}
	if _, err := ParseRecompute(string(rc)); err != nil {
		return ActivationUse{}, err
	}
	z := sizer{dry: true}
	newActivations(cfg, B, T, rc, &z)
	newGradScratch(cfg, B, T, attScratch, &z)
	return z.use, nil
}

// checkShape refuses a micro-batch that does not fit cfg, or whose largest
// activation buffer (the probabilities, the logits, the MLP's) would be
// past maxBufferFloats.
func checkShape(cfg Config, B, T int) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if B < 1 || T < 1 || T > cfg.Seq {
		return fmt.Errorf("model: micro-batch %d×%d: want B ≥ 1 and 1 ≤ T ≤ seq (%d)", B, T, cfg.Seq)
	}
	per := max(cfg.Heads*T, cfg.Vocab, 4*cfg.Embd) // floats per token of the largest buffer, each < 2^31
	if B > maxBufferFloats/T/per {
		return fmt.Errorf("model: micro-batch %d×%d: over %d floats in one activation buffer; use a smaller batch.micro_batch or batch.seq", B, T, maxBufferFloats)
	}
	return nil
}

// ActivationUse is what m's activation buffers hold, by part: those kept by
// forward for backward, recomputation's and backward's scratch. Parameters
// and gradients are the store's to report.
func (m *Model) ActivationUse() ActivationUse { return m.use }

// ActivationBytes is the total of m's activation buffers (ActivationUse).
func (m *Model) ActivationBytes() int64 { return m.use.Total() }
