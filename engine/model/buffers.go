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

// activations hold what forward keeps for backward. With full recomputation
// there is one layerActs, refilled per block, and the block inputs; else one
// per block. The residual stream res[l] is block l's input, res[L] the final
// output.
type activations struct {
	layers     []layerActs
	res        [][]float32
	proj       []float32 // c_proj outputs, consumed at once by the residual add
	lnf        []float32
	lnfMean    []float32
	lnfRstd    []float32
	probs      []float32 // (N, V); the logits, then softmax, then their gradient
	losses     []float32
	total      int64
	sharedGelu bool // selective recomputation: one fchGelu for all blocks
}

func newActivations(cfg Config, B, T int, rc Recompute) activations {
	N, C, L := B*T, cfg.Embd, cfg.Layers
	var a activations
	alloc := func(n int) []float32 {
		a.total += int64(n)
		return make([]float32, n)
	}
	nActs := L
	if rc == RecomputeFull {
		nActs = 1
	}
	var gelu []float32
	if rc != RecomputeNone {
		a.sharedGelu = true
		gelu = alloc(N * 4 * C)
	}
	for range nActs {
		la := layerActs{
			ln1: alloc(N * C), ln1Mean: alloc(N), ln1Rstd: alloc(N),
			qkv: alloc(N * 3 * C), atty: alloc(N * C), att: alloc(B * cfg.Heads * T * T),
			res2: alloc(N * C), ln2: alloc(N * C), ln2Mean: alloc(N), ln2Rstd: alloc(N),
			fch: alloc(N * 4 * C), fchGelu: gelu,
		}
		if gelu == nil {
			la.fchGelu = alloc(N * 4 * C)
		}
		a.layers = append(a.layers, la)
	}
	for range L + 1 {
		a.res = append(a.res, alloc(N*C))
	}
	a.proj = alloc(N * C)
	a.lnf, a.lnfMean, a.lnfRstd = alloc(N*C), alloc(N), alloc(N)
	a.probs, a.losses = alloc(N*cfg.Vocab), alloc(N)
	return a
}

func (a *activations) floats() int64 { return a.total }

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
	total   int64
}

func newGradScratch(cfg Config, B, T, attScratch int) gradScratch {
	N, C := B*T, cfg.Embd
	var g gradScratch
	alloc := func(n int) []float32 {
		g.total += int64(n)
		return make([]float32, n)
	}
	g.dres, g.dln, g.dqkv, g.datty = alloc(N*C), alloc(N*C), alloc(N*3*C), alloc(N*C)
	g.dfch, g.dgelu, g.scratch = alloc(N*4*C), alloc(N*4*C), alloc(attScratch)
	return g
}

func (g *gradScratch) floats() int64 { return g.total }
