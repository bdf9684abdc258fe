package model

// layerWeights are one block's tensors, in Params order.
type layerWeights struct {
	ln1w, ln1b         []float32
	qkvw, qkvb         []float32
	attprojw, attprojb []float32
	ln2w, ln2b         []float32
	fcw, fcb           []float32
	fcprojw, fcprojb   []float32
	// The matrices as bfloat16 bits, in place of their float32 forms,
	// when the store lends its bfloat16 working parameters and the
	// backend multiplies by them (blockViewBF16).
	qkvw16, attprojw16, fcw16, fcprojw16 []uint16
}

// clearVectors zeroes the block's vectors (gains and biases): the part of
// a gradient buffer that backward adds into rather than writes.
func (lw *layerWeights) clearVectors() {
	for _, v := range [][]float32{lw.ln1w, lw.ln1b, lw.qkvb, lw.attprojb, lw.ln2w, lw.ln2b, lw.fcb, lw.fcprojb} {
		clear(v)
	}
}
