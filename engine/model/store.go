package model

import "github.com/gtrain/gtrain/engine/comm"

// A unit is the granule in which the engine moves parameters and their
// gradients: unit 0 holds the embeddings (wte, wpe), unit 1+l block l, and
// the last unit the final LayerNorm. Each is a contiguous run of the flat
// parameter layout of Config.Params, so that ZeRO can gather one unit (a
// layer) just before it is used and reduce its gradients as soon as
// backward has produced them.
type Unit struct {
	Offset, Size int // in the flat parameter layout
}

// Units lists c's units in flat order.
func (c Config) Units() []Unit {
	C, L := c.Embd, c.Layers
	emb := c.Vocab*C + c.Seq*C
	block := 2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C
	us := make([]Unit, 0, L+2)
	us = append(us, Unit{0, emb})
	for l := range L {
		us = append(us, Unit{emb + l*block, block})
	}
	return append(us, Unit{emb + L*block, 2 * C})
}

// Store holds a model's parameters and gradients; the model asks it for one
// unit at a time. The dense store keeps everything in two flat slices; the
// ZeRO stores of engine/zero gather partitioned or low-precision parameters
// on demand and reduce gradients as units complete.
//
// In a forward pass the model calls Weights(u) before using unit u and
// Release(u) after; Prefetch(u) says which unit it will ask for next, so
// that a store can start fetching it while the current one computes. In a
// backward pass it also calls Grads(u) once, before unit u's first gradient
// (for the embeddings that is at the start of backward, because the tied
// output layer contributes first), and GradsDone(u) when unit u's gradient
// of this micro-batch is complete.
type Store interface {
	Weights(u int) []float32 // unit u as float32, laid out as in Params; valid until Release(u)
	Release(u int)
	Prefetch(u int)
	Grads(u int) []float32 // where backward accumulates (+=) unit u's gradients
	GradsDone(u int)
}

// BF16Weights is a Store whose working parameters are bfloat16 and that
// lends them as they are. WeightsBF16(u) is unit u's parameters as
// bfloat16 bits, laid out as in Params, valid until Release(u), in place of
// Weights(u); nil when the store cannot (then the model asks Weights). A
// model whose backend multiplies by bfloat16 weights
// (backend.BF16Weights) passes the matrices to it in place and decodes
// only the vectors, so that no unit is decoded whole in forward and again
// in backward to be rounded back to bfloat16 by the matmuls.
type BF16Weights interface {
	WeightsBF16(u int) []uint16
}

// GradsWriter is a Store that can lend a unit's gradient buffer for
// backward to write rather than add to. GradsWrite(u) is Grads(u) with its
// contents undefined, or nil when the buffer holds gradients to add to
// (then the model calls Grads): backward writes every element, each weight
// matrix's gradient by its matmul (beta 0) and the rest after clearing
// it. A store that converts each unit's gradients from fresh float32
// scratch (engine/zero's 16-bit gradients) then neither clears the
// scratch nor has the matmuls read the zeros back.
type GradsWriter interface {
	GradsWrite(u int) []float32
}

// dense is the Store of a rank holding every parameter and gradient in
// float32 (Model.Params and Model.Grads): views, no copies.
type dense struct {
	params, grads []float32
	units         []Unit
}

func newDense(c Config) *dense {
	n := c.NumParams()
	return &dense{params: make([]float32, n), grads: make([]float32, n), units: c.Units()}
}

func (d *dense) view(s []float32, u int) []float32 {
	x := d.units[u]
	return s[x.Offset : x.Offset+x.Size : x.Offset+x.Size]
}

func (d *dense) Weights(u int) []float32 { return d.view(d.params, u) }
func (d *dense) Grads(u int) []float32   { return d.view(d.grads, u) }
func (d *dense) Release(int)             {}
func (d *dense) Prefetch(int)            {}
func (d *dense) GradsDone(int)           {}

// embView splits the embedding unit into wte and wpe.
func (c Config) embView(flat []float32) (wte, wpe []float32) {
	n := c.Vocab * c.Embd
	return flat[:n:n], flat[n:]
}

// blockView slices a block unit into its tensors, in Params order.
func (c Config) blockView(flat []float32) layerWeights {
	C := c.Embd
	next := func(n int) []float32 {
		s := flat[:n:n]
		flat = flat[n:]
		return s
	}
	return layerWeights{
		ln1w: next(C), ln1b: next(C), qkvw: next(3 * C * C), qkvb: next(3 * C),
		attprojw: next(C * C), attprojb: next(C), ln2w: next(C), ln2b: next(C),
		fcw: next(4 * C * C), fcb: next(4 * C), fcprojw: next(4 * C * C), fcprojb: next(C),
	}
}

// blockVectors is how many elements of a block are vectors (LayerNorm
// gains and biases, linear biases): what blockViewBF16 decodes.
func (c Config) blockVectors() int { return 13 * c.Embd }

// blockViewBF16 slices a block unit of bfloat16 bits into its tensors:
// the matrices as views (the ...16 fields), the vectors decoded (exactly)
// into vec, c.blockVectors() long.
func (c Config) blockViewBF16(flat []uint16, vec []float32) layerWeights {
	C := c.Embd
	next := func(n int) []uint16 {
		s := flat[:n:n]
		flat = flat[n:]
		return s
	}
	vector := func(n int) []float32 {
		v := vec[:n:n]
		vec = vec[n:]
		comm.DecodeBF16(v, next(n))
		return v
	}
	var lw layerWeights
	lw.ln1w, lw.ln1b = vector(C), vector(C)
	lw.qkvw16, lw.qkvb = next(3*C*C), vector(3*C)
	lw.attprojw16, lw.attprojb = next(C*C), vector(C)
	lw.ln2w, lw.ln2b = vector(C), vector(C)
	lw.fcw16, lw.fcb = next(4*C*C), vector(4*C)
	lw.fcprojw16, lw.fcprojb = next(4*C*C), vector(C)
	return lw
}

// finalView splits the final unit into the LayerNorm's gain and bias.
func (c Config) finalView(flat []float32) (w, b []float32) {
	return flat[:c.Embd:c.Embd], flat[c.Embd:]
}
