package zero

import (
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/tensorpar"
)

// ShardTensor is one tensor of a tensor- and pipeline-parallel rank's flat
// parameters (a model.Stage's), as the distributed optimizer sees it.
type ShardTensor struct {
	// Param is where the tensor lies in the flat parameters and gradients,
	// and whether weight decay applies.
	model.Param
	// Replicated says that every rank of the TP group holds the whole
	// tensor with the same gradient (LayerNorms, row-parallel biases, the
	// position embedding): only TP rank 0 counts it in the global norm.
	Replicated bool
	// Tied says that the tensor is the tied token embedding, held by the
	// first and the last pipeline stage with the same gradient after
	// model.Stage.ReduceTied: only the first stage counts it.
	Tied bool
}

// StageTensors describes st's tensors for NewDist: its shards, replicated
// where tensorpar says so, the token embedding tied.
func StageTensors(st *model.Stage) []ShardTensor {
	var ts []ShardTensor
	for _, p := range st.Shards() {
		ts = append(ts, ShardTensor{Param: p.Param, Replicated: p.Part.Split == tensorpar.Replicated, Tied: p.Name == tiedName})
	}
	return ts
}

// tiedName is the tensor the first and last pipeline stage share (GPT-2's
// output layer is the token embedding).
const tiedName = "transformer.wte.weight"

// DistConfig is the setup of a distributed optimizer.
type DistConfig struct {
	// Stage is the ZeRO stage: 0 (gradients all-reduced over DP, every
	// rank steps everything) or 1 (Megatron-LM's distributed optimizer:
	// reduce-scatter, each DP rank steps and keeps the optimizer state of
	// its 1/dp of the shard, all-gather).
	Stage int
	// Params is the working parameters' type: Float32 (or 0), or BFloat16
	// or Float16 for mixed precision. The stage keeps float32 slices
	// either way (the CPU kernels decode to float32 anyway); in mixed
	// precision their values are the fp32 master weights, which the
	// optimizer keeps for the elements it owns, rounded to Params.
	Params comm.DType
	// Grads is the type the gradients are averaged over DP in: Float32 (or
	// 0), or Params' type, half the bytes on the wire. The stage
	// accumulates them in float32 either way.
	Grads  comm.DType
	Scaler ScalerConfig // fp16 only: dynamic (or static) loss scaling
	Optim  optim.Config
}

// DistOptimizer is the optimizer step of one rank of a TP × PP × DP
// layout: it averages the gradients of the rank's shard over its
// DP group, takes the global gradient norm of the whole model (each
// element counted once: see ShardTensor) for clipping, and applies AdamW
// with the clip factor folded in. It holds the AdamW moments of the
// elements it owns: all of the shard at ZeRO-0, comm.Block's 1/dp at
// ZeRO-1. Params and grads are the caller's (a model.Stage's) and are
// updated in place. In mixed precision (bf16, fp16) it also keeps the
// fp32 master weights of the elements it owns, steps those, and writes
// them back into params rounded to the working type; with fp16 it scales
// the loss (LossScale) and skips the steps whose gradients overflowed.
type DistOptimizer struct {
	cfg           DistConfig
	gs            *parallel.Groups
	params, grads []float32
	lo, hi        int       // the owned range of the flat vector
	pieces        []piece   // the owned range cut at tensor boundaries
	counted       []bool    // whether this rank counts each piece in the norm
	master        []float32 // mixed precision: fp32 master weights of [lo, hi)
	wire          comm.Buffer
	opt           *optim.AdamW
	scaler        scaler
}

// NewDist builds the distributed optimizer of the rank of gs whose flat
// parameters and gradients are params and grads, laid out as tensors (in
// order, covering them exactly). The parameters must be the same on every
// rank of the DP group.
func NewDist(cfg DistConfig, gs *parallel.Groups, tensors []ShardTensor, params, grads []float32) (*DistOptimizer, error) {
	cfg.Params, cfg.Grads = orF32(cfg.Params), orF32(cfg.Grads)
	if err := checkDist(cfg, gs, tensors, params, grads); err != nil {
		return nil, err
	}
	d := &DistOptimizer{cfg: cfg, gs: gs, params: params, grads: grads}
	d.scaler = newScaler(cfg.Scaler, cfg.Params == comm.Float16)
	ranks, rank := 1, 0
	if cfg.Stage == 1 {
		ranks, rank = gs.DP.Size(), gs.DP.Rank()
	}
	// One segment, the whole shard: one reduce-scatter and one all-gather
	// per step. A rank's shard is already 1/(tp·pp) of the model; bucketing
	// it to overlap with backward (as Engine does) is for the trainer.
	whole := []Segment{{Offset: 0, Size: len(params), First: 0, Last: len(tensors) - 1}}
	part := NewPartition(whole, ranks, rank)
	d.lo, d.hi, _ = part.Owned(0)
	list := make([]model.Param, len(tensors))
	byOffset := make(map[int]ShardTensor, len(tensors))
	for i, t := range tensors {
		list[i], byOffset[t.Offset] = t.Param, t
	}
	d.pieces = part.pieces(list)
	d.counted = make([]bool, len(d.pieces))
	for i, pc := range d.pieces {
		d.counted[i] = d.counts(byOffset[pc.param.Offset])
	}
	d.opt = optim.NewAdamW(cfg.Optim, part.Size(), nil)
	if cfg.Grads != comm.Float32 && gs.DP.Size() > 1 {
		d.wire = comm.NewBuffer(cfg.Grads, len(grads))
	}
	d.Reload()
	return d, nil
}

// counts says whether this rank adds t's squares (of the elements it owns)
// to the global norm: a replicated tensor on TP rank 0 only, the tied
// embedding on the first stage only, and at ZeRO-0, where every DP rank
// holds the same averaged gradient, on DP rank 0 only. At ZeRO-1 each
// element has one owner in its DP group, which counts it.
func (d *DistOptimizer) counts(t ShardTensor) bool {
	c := d.gs.Coord
	switch {
	case t.Replicated && c.TP != 0, t.Tied && c.PP != 0:
		return false
	case d.cfg.Stage == 0 && c.DP != 0:
		return false
	}
	return true
}

// checkDist refuses a setup the optimizer cannot step.
func checkDist(cfg DistConfig, gs *parallel.Groups, tensors []ShardTensor, params, grads []float32) error {
	if cfg.Stage != 0 && cfg.Stage != 1 {
		return fmt.Errorf("zero: distributed optimizer: ZeRO stage %d: with tensor or pipeline parallelism only stages 0 and 1 are supported (DeepSpeed refuses 2 and 3 with pipeline parallelism too): set zero.stage to 0 or 1", cfg.Stage)
	}
	if err := cfg.Optim.Validate(); err != nil {
		return fmt.Errorf("zero: distributed optimizer: %w", err)
	}
	if err := checkDistTypes(cfg); err != nil {
		return err
	}
	if gs == nil || gs.World == nil || gs.DP == nil {
		return errors.New("zero: distributed optimizer: no process groups (parallel.New builds them, for one rank too)")
	}
	if len(params) != len(grads) {
		return fmt.Errorf("zero: distributed optimizer: %d parameters but %d gradients: they must have the same layout", len(params), len(grads))
	}
	at := 0
	for _, t := range tensors {
		if t.Offset != at || t.Size() < 1 {
			return fmt.Errorf("zero: distributed optimizer: tensor %s at offset %d with %d elements: want the tensors in order, from offset %d, none empty", t.Name, t.Offset, t.Size(), at)
		}
		at += t.Size()
	}
	if at != len(params) || at == 0 {
		return fmt.Errorf("zero: distributed optimizer: the tensors cover %d elements of %d parameters: they must cover all of them", at, len(params))
	}
	return nil
}

// Owned is the range [lo, hi) of the flat vector whose optimizer state
// this rank keeps and which it updates.
func (d *DistOptimizer) Owned() (lo, hi int) { return d.lo, d.hi }

// Optimizer is the AdamW state of the owned elements (moments indexed from
// lo of Owned).
func (d *DistOptimizer) Optimizer() *optim.AdamW { return d.opt }

// OptimizerBytes is the memory of the optimizer state: the Adam moments
// of the owned elements, and in mixed precision their fp32 master weights
// (fp32 training keeps no separate master copy).
func (d *DistOptimizer) OptimizerBytes() int64 {
	return int64(len(d.opt.M)+len(d.opt.V)+len(d.master)) * 4
}

// BufferBytes is the memory of the buffer the gradients are averaged in
// when they travel in a 16-bit type (0 otherwise).
func (d *DistOptimizer) BufferBytes() int64 { return int64(len(d.wire.Bytes())) }
