package planner

import (
	"cmp"
	"fmt"
	"math"
)

// StateStorage is how a framework keeps working weights and gradients
// where it differs from the ZeRO paper's mixed precision (2-byte weights
// and gradients under bf16 and fp16, 4-byte under fp32). The optimizer
// state is the paper's in every case: fp32 Adam moments, plus fp32 master
// weights under mixed precision. The zero value is the paper's.
type StateStorage struct {
	// Weights and Grads are the bytes of a working weight and of a
	// gradient element on every layout; 0 means the precision's.
	Weights float64 `json:"weights,omitempty"`
	Grads   float64 `json:"grads,omitempty"`
	// MPWeights and MPGrads replace them on layouts with tp·pp > 1; 0
	// means no replacement. The built-in engine needs them: its tensor-
	// and pipeline-parallel ranks keep float32 working weights (rounded to
	// the precision) and float32 gradients, its data-parallel path real
	// 16-bit ones.
	MPWeights float64 `json:"mp_weights,omitempty"`
	MPGrads   float64 `json:"mp_grads,omitempty"`
}

// validate reports a size no framework uses.
func (st StateStorage) validate() error {
	for _, b := range []float64{st.Weights, st.Grads, st.MPWeights, st.MPGrads} {
		if !(b >= 0 && b <= 8) {
			return fmt.Errorf("state element size %g bytes: want 0 (the precision's) to 8", b)
		}
	}
	return nil
}

// bytes is w, g and k per element (see Precision.stateBytes) as st keeps
// them at precision p, on a layout with model parallelism when mp.
func (st StateStorage) bytes(p Precision, mp bool) (w, g, k float64) {
	w, g, k = p.stateBytes()
	w, g = cmp.Or(st.Weights, w), cmp.Or(st.Grads, g)
	if mp {
		w, g = cmp.Or(st.MPWeights, w), cmp.Or(st.MPGrads, g)
	}
	return w, g, k
}

// rankStates is the model states of DP rank d of nd at ZeRO stage whose
// model-parallel part holds psi parameters, at w, g and k bytes per
// element. ZeRO's partitions give each DP rank a block of psi as
// comm.Block cuts it (the first psi mod nd ranks own one element more),
// which is what the engine's distributed optimizer owns exactly, and
// Megatron-LM's up to its padding; ModelStates is the same with psi/nd.
func rankStates(psi float64, d, nd, stage int, w, g, k float64) (params, grads, opt float64) {
	owned := psi
	if stage >= 1 {
		owned = blockOf(psi, d, nd)
	}
	params, grads, opt = w*psi, g*psi, k*owned
	if stage >= 2 {
		grads = g * owned
	}
	if stage >= 3 {
		params = w * owned
	}
	return params, grads, opt
}

// blockOf is the size of block r of n elements cut into k blocks as
// comm.Block cuts them: n/k, one more for the first n mod k blocks.
func blockOf(n float64, r, k int) float64 {
	q := math.Floor(n / float64(k))
	if float64(r) < n-q*float64(k) {
		q++
	}
	return q
}
