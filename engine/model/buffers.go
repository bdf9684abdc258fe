package model

// layerWeights are one block's tensors, in Params order.
type layerWeights struct {
	ln1w, ln1b         []float32
	qkvw, qkvb         []float32
	attprojw, attprojb []float32
	ln2w, ln2b         []float32
	fcw, fcb           []float32
	fcprojw, fcprojb   []float32
}
