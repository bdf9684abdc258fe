package planner

import "fmt"

// Precision is the training precision: mixed 16-bit with fp32 master
// weights and Adam moments, or fp32 throughout.
type Precision string

// The precisions.
const (
	BF16 Precision = "bf16"
	FP16 Precision = "fp16"
	FP32 Precision = "fp32"
)

// ParsePrecision accepts bf16, fp16 or fp32.
func ParsePrecision(s string) (Precision, error) {
	switch p := Precision(s); p {
	case BF16, FP16, FP32:
		return p, nil
	}
	return "", fmt.Errorf("precision %q: want bf16, fp16 or fp32", s)
}

// stateBytes are bytes per parameter of weights, gradients and optimizer
// state. Mixed precision with Adam (ZeRO paper, section 3.1): 2Ψ fp16
// weights, 2Ψ fp16 gradients and KΨ with K = 12 (fp32 master weights,
// momentum, variance). fp32: 4Ψ, 4Ψ and 8Ψ (the weights are the master).
func (p Precision) stateBytes() (w, g, k float64) {
	if p == FP32 {
		return 4, 4, 8
	}
	return 2, 2, 12
}

// actBytes is the size of an activation element.
func (p Precision) actBytes() float64 {
	if p == FP32 {
		return 4
	}
	return 2
}

// Recompute is the activation recomputation mode (Korthikanti et al. 2022).
type Recompute string

// The recomputation modes.
const (
	RecomputeNone      Recompute = "none"      // keep every activation
	RecomputeSelective Recompute = "selective" // drop and recompute the attention core (softmax, dropout, scores)
	RecomputeFull      Recompute = "full"      // keep only each layer's input, recompute the layer
)

// Recomputes lists the modes in search order.
var Recomputes = []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull}

// ParseRecompute accepts none, selective or full.
func ParseRecompute(s string) (Recompute, error) {
	switch r := Recompute(s); r {
	case RecomputeNone, RecomputeSelective, RecomputeFull:
		return r, nil
	}
	return "", fmt.Errorf("recompute %q: want none, selective or full", s)
}

// Memory is bytes per GPU on the most loaded rank, by category.
type Memory struct {
	Params      float64 `json:"params"`
	Grads       float64 `json:"grads"`
	Optimizer   float64 `json:"optimizer"`
	Activations float64 `json:"activations"`
	Buffers     float64 `json:"buffers"`
	Total       float64 `json:"total"`
}

// ModelStates is the ZeRO paper's model-state memory of psi parameters on
// one GPU of a data-parallel group of nd: weights w·Ψ, gradients g·Ψ and
// optimizer k·Ψ, with stage 1 dividing the optimizer by nd, stage 2 also
// the gradients, stage 3 also the weights (Rajbhandari et al. 2020, Fig. 1).
func ModelStates(psi float64, nd, stage int, p Precision) (params, grads, opt float64) {
	w, g, k := p.stateBytes()
	params, grads, opt = w*psi, g*psi, k*psi
	d := float64(nd)
	if stage >= 1 {
		opt /= d
	}
	if stage >= 2 {
		grads /= d
	}
	if stage >= 3 {
		params /= d
	}
	return params, grads, opt
}

// ActStorage is how a framework keeps activations where it differs from
// the Megatron-LM of Korthikanti et al. 2022. The zero value is the paper's:
// elements of the precision's size and dropout, whose one-byte masks and
// outputs are kept too.
type ActStorage struct {
	// ElemBytes is the size of an activation element; 0 means the
	// precision's (2 for bf16 and fp16, 4 for fp32).
	ElemBytes float64
	// NoDropout: the model has no dropout, so no masks are kept and the
	// attention keeps its softmax output once (the dropout output is it).
	NoDropout bool
}

// validate reports an element size no framework uses.
func (st ActStorage) validate() error {
	if !(st.ElemBytes >= 0 && st.ElemBytes <= 8) {
		return fmt.Errorf("activation element size %g bytes: want 0 (the precision's) to 8", st.ElemBytes)
	}
	return nil
}

// elemBytes is the element size st gives at precision p.
func (st ActStorage) elemBytes(p Precision) float64 {
	if st.ElemBytes > 0 {
		return st.ElemBytes
	}
	return p.actBytes()
}

// actShape is what the activation formulas need for one micro-batch.
type actShape struct {
	s, b, h, a float64 // sequence, micro-batch, hidden, heads
	t          float64 // tensor-parallel degree
	sp         bool    // sequence parallelism with TP (Korthikanti et al. 2022, section 4.2.2)
	e          float64 // bytes per activation element (2 in the paper)
	mask       float64 // bytes per dropout mask element: 1 in the paper, 0 without dropout
	split      float64 // bytes per s·b·h of the parts TP splits: Q, K, V, the projection input, the MLP
}

func newActShape(m Model, b, t int, sp bool, p Precision, st ActStorage) actShape {
	e := st.elemBytes(p)
	mask := 1.0
	if st.NoDropout {
		mask = 0
	}
	h := float64(m.Hidden)
	kv := float64(m.KVHeads) / float64(m.Heads)
	// Q, K and V (the latter two scaled for grouped-query attention) and the
	// attention output projection's input; the MLP keeps its activation's
	// input and the second matrix's input (GELU: 2·ffn) or, for SwiGLU, the
	// gate and up outputs and the down input (3·ffn).
	mlp := 2.0
	if m.Arch == ArchLlama {
		mlp = 3
	}
	split := e*(2+2*kv) + e*mlp*float64(m.FFN)/h
	return actShape{s: float64(m.Seq), b: float64(b), h: h, a: float64(m.Heads), t: float64(t), sp: sp && t > 1, e: e, mask: mask, split: split}
}

// LayerActivations is the activation memory of one transformer layer for one
// micro-batch, after Korthikanti et al. 2022, section 4 (bytes, 16-bit):
//
//	no parallelism:        s·b·h·(34 + 5·a·s/h)
//	tensor parallel t:     s·b·h·(10 + 24/t + 5·a·s/(h·t))
//	TP + sequence parallel: s·b·h/t·(34 + 5·a·s/h)
//	selective recompute:   the 5·a·s/h term goes (34·s·b·h/t with TP+SP)
//	full recompute:        2·s·b·h, the layer's input only (/t with SP)
//
// The 34 is 2 bytes × (4 LayerNorm inputs + QKV input + MLP input + Q, K, V
// and the projection input + 8 for GELU's input and output at ffn = 4h) + 2
// one-byte dropout masks; the 5·a·s/h is the softmax output (2), its dropout
// mask (1) and dropout output (2) per head. Other shapes (grouped-query
// attention, SwiGLU, fp32) rescale those same terms.
func LayerActivations(m Model, b, t int, sp bool, p Precision, rc Recompute) float64 {
	x := newActShape(m, b, t, sp, p, ActStorage{})
	return x.layer(rc)
}

// ActivationMemory is the activation memory of one micro-batch of a whole
// model on one rank (no tensor or pipeline parallelism), in bytes, by the
// parts the cost model counts.
type ActivationMemory struct {
	Layer      float64 // what forward keeps for backward in each layer
	Head       float64 // the final norm's input, the output layer's input and the fp32 logits
	WorkingSet float64 // what recomputation needs live in backward on top of what is kept
}

// Total is the model's activation memory: every layer, the head and the
// working set.
func (a ActivationMemory) Total(layers int) float64 {
	return float64(layers)*a.Layer + a.Head + a.WorkingSet
}

// ModelActivations is the activation memory of m for micro-batches of b
// sequences of m.Seq tokens kept as st says: the figures a search charges a
// layout with TP = PP = 1, and what a framework that keeps the same tensors
// (the built-in engine: 4-byte elements, no dropout) allocates for them.
func ModelActivations(m Model, b int, p Precision, st ActStorage, rc Recompute) ActivationMemory {
	x := newActShape(m, b, 1, false, p, st)
	return ActivationMemory{Layer: x.layer(rc), Head: x.headActivations(m.Vocab), WorkingSet: x.workingSet(rc)}
}

func (x actShape) layer(rc Recompute) float64 {
	sbh := x.s * x.b * x.h
	if rc == RecomputeFull {
		if x.sp {
			return x.e * sbh / x.t
		}
		return x.e * sbh
	}
	// Replicated under TP without SP: two LayerNorm inputs, the QKV and MLP
	// inputs (4 tensors of e bytes) and the dropout masks after the
	// attention projection and the MLP.
	repl := 4*x.e + 2*x.mask
	v := sbh * (x.split / x.t)
	if x.sp {
		v += sbh * repl / x.t
	} else {
		v += sbh * repl
	}
	if rc == RecomputeNone {
		v += x.core()
	}
	return v
}

// core is the attention core a selective recompute drops: softmax output,
// dropout mask and dropout output, a·s² each per sequence, split by TP.
// Without dropout the softmax output is all there is.
func (x actShape) core() float64 {
	per := 2*x.e + x.mask
	if x.mask == 0 {
		per = x.e
	}
	return per * x.a * x.s * x.s * x.b / x.t
}

// workingSet is what recomputation needs live on top of what it stores: a
// full recompute rebuilds one layer's activations for its backward (all but
// the layer input, which it keeps), a selective one the attention core of
// one layer.
func (x actShape) workingSet(rc Recompute) float64 {
	switch rc {
	case RecomputeFull:
		return x.layer(RecomputeNone) - x.layer(RecomputeFull)
	case RecomputeSelective:
		return x.core()
	}
	return 0
}

// headActivations is the last stage's extra for one micro-batch: the final
// norm and output layer's inputs (e bytes each) and the fp32 logits for the
// cross entropy; 4·s·b·h/t·(1 + V/h) in the paper's 16-bit count, which
// assumes sequence parallelism. Without it the final norm runs on every
// row on every TP rank, so its input and output are replicated (2·e·s·b·h),
// and only the vocabulary-parallel logits are split by t.
func (x actShape) headActivations(vocab int) float64 {
	norm := 2 * x.e * x.h
	if x.sp {
		norm /= x.t
	}
	return (norm + 4*float64(vocab)/x.t) * x.s * x.b
}
