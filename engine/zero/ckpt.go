package zero

import (
	"fmt"
	"slices"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// Optimizer-state tensors are named after their parameter, as PyTorch's
// AdamW state_dict calls the moments.
const (
	ExpAvgPrefix   = ckpt.OptimizerPrefix + "exp_avg."
	ExpAvgSqPrefix = ckpt.OptimizerPrefix + "exp_avg_sq."
)

// savedState is one kind of tensor a checkpoint holds: its name prefix and
// where an owned piece's values live.
type savedState struct {
	prefix string
	data   func(piece) []float32
}

// saved lists what a checkpoint holds of each parameter: the fp32 master
// weights under the parameter's own name, and the two Adam moments.
func (e *Engine) saved() []savedState {
	return []savedState{
		{"", e.masterOf},
		{ExpAvgPrefix, func(pc piece) []float32 { return e.opt.M[pc.at : pc.at+pc.n] }},
		{ExpAvgSqPrefix, func(pc piece) []float32 { return e.opt.V[pc.at : pc.at+pc.n] }},
	}
}

// Shard is what this rank writes into a checkpoint: its part of the fp32
// master weights (under the parameters' own names) and of the Adam moments,
// as shards of the full tensors. Stage 0 ranks all hold everything; each
// writes the part it would own at stage 1, so every stage's checkpoint
// holds each value once. With gradient compression it adds the rank's
// compression state (compress_ckpt.go). The tensors' Data alias the
// engine's state.
func (e *Engine) Shard() []ckpt.Tensor {
	pieces := e.pieces
	if e.cfg.Stage == 0 && e.Ranks() > 1 {
		pieces = NewPartition(e.part.Segments, e.Ranks(), e.comm.Rank()).pieces(e.params)
		for i := range pieces {
			pieces[i].at = pieces[i].lo // stage 0 stores everything in flat order
		}
	}
	ts := make([]ckpt.Tensor, 0, 3*len(pieces))
	for _, src := range e.saved() {
		for _, pc := range pieces {
			ts = append(ts, ckpt.Tensor{Name: src.prefix + pc.param.Name, Shape: pc.param.Shape,
				Offset: pc.lo - pc.param.Offset, Data: src.data(pc)})
		}
	}
	return append(ts, e.cz.shard()...)
}

// Load fills this rank's part of the master weights and moments from c,
// whatever layout wrote it (any DP size, any stage: the tensors are
// assembled from their shards and sliced), then rebuilds the working
// parameters; the gradient compression state is restored where the
// checkpoint holds it for this layout (see CompressionNote). Every rank
// must call it: stages 1–2 all-gather.
func (e *Engine) Load(c *ckpt.Checkpoint) error {
	for i := 0; i < len(e.pieces); {
		p := e.pieces[i].param
		j := i
		for j < len(e.pieces) && e.pieces[j].param.Name == p.Name {
			j++
		}
		for _, dst := range e.saved() {
			full, shape, err := c.Tensor(dst.prefix + p.Name)
			if err != nil {
				return err
			}
			if !slices.Equal(shape, p.Shape) {
				return fmt.Errorf("zero: load %s: tensor %s has shape %v, the model's is %v: is this checkpoint of the same model?", c.Dir, dst.prefix+p.Name, shape, p.Shape)
			}
			for _, pc := range e.pieces[i:j] {
				off := pc.lo - p.Offset
				copy(dst.data(pc), full[off:off+pc.n])
			}
		}
		i = j
	}
	if err := e.cz.load(c); err != nil {
		return err
	}
	return e.publish(false)
}
