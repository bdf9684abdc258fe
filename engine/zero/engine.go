// Package zero is the engine's data-parallel training state, partitioned
// as DeepSpeed's ZeRO partitions it. Stage 0 is plain data parallelism:
// every rank holds everything and gradients are averaged with bucketed
// all-reduces launched during backward. Stage 1 partitions the optimizer
// state (fp32 master weights and Adam moments): each rank updates the part
// it owns and all-gathers the updated parameters. Stage 2 also partitions
// the gradients: each bucket is reduce-scattered as soon as backward has
// filled it, so no rank holds a full gradient. Stage 3 also partitions the
// parameters: each layer is all-gathered just before use, in forward and
// again in backward, with the next layer's gather prefetched, and freed
// after. Parameters may be kept in bf16 or fp16 with fp32 master weights
// (mixed precision), with dynamic loss scaling for fp16.
//
// An Engine is the model.Store of a rank's model and owns its optimizer.
package zero

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// Config is the data-parallel setup of a rank.
type Config struct {
	Stage int // ZeRO stage, 0 to 3
	// Params is the type of the working parameters the model computes
	// with: Float32, or BFloat16 or Float16 for mixed precision, which
	// keeps fp32 master weights beside them.
	Params comm.DType
	// Grads is the type gradients are accumulated and reduced in: Float32,
	// or Params' type (half the bytes on the wire).
	Grads comm.DType
	// FirstBucket and Bucket are the gradient bucket sizes of stages 0–2,
	// in elements (see Buckets).
	FirstBucket, Bucket int
	Scaler              ScalerConfig // fp16 only
	Optim               optim.Config
	// Compress is how the gradients of stages 0–1 travel (compress.go).
	Compress Compression
	// Threads is how many goroutines share the engine's passes over
	// every parameter (conversions, AdamW): the rank's compute threads.
	// Below 1 means one.
	Threads int
}

// Validate reports the first setting out of range.
func (c Config) Validate() error {
	switch {
	case c.Stage < 0 || c.Stage > 3:
		return fmt.Errorf("zero: stage %d: want 0, 1, 2 or 3", c.Stage)
	case c.Params == 0 || c.Grads == 0:
		return fmt.Errorf("zero: parameter and gradient types must be set")
	case c.Grads != comm.Float32 && c.Grads != c.Params:
		return fmt.Errorf("zero: gradients in %s with parameters in %s: gradients are kept in fp32 or in the parameters' type", c.Grads, c.Params)
	}
	if err := c.Compress.validate(c.Stage); err != nil {
		return err
	}
	return c.Scaler.validate()
}

// Engine is one rank's share of the training state; it implements
// model.Store. It is not safe for concurrent use: one goroutine runs the
// model, and the communicator's own goroutine runs the collectives the
// engine starts.
type Engine struct {
	cfg    Config
	mcfg   model.Config
	units  []model.Unit
	params []model.Param
	comm   *comm.Communicator // nil for a single rank
	ctx    context.Context
	part   Partition
	segOf  []int // the segment of each unit
	pieces []piece
	opt    *optim.AdamW

	work    comm.Buffer // stages 0–2: every working parameter
	own     comm.Buffer // stage 3: the owned working parameters
	master  []float32   // owned fp32 master weights (mixed precision, or stage 3's fp32 own)
	grads   comm.Buffer // stages 0–1: every gradient
	ownGrad comm.Buffer // stages 2–3: the owned gradients

	pool     pool
	live     map[int]*liveUnit   // unit weights gathered or decoded
	emb      []float32           // stages 0–2, 16-bit: the embedding unit decoded (see embedding)
	embValid bool                // emb holds the working parameters as they are
	open     map[int][]float32   // gradient buffers handed out by Grads
	send     map[int]comm.Buffer // stages 2–3: segments being filled for a reduce-scatter
	done     []int               // units of each segment complete this micro-batch
	fresh    []bool              // stages 0–1, low-precision gradients: unit's gradients are zero since the step
	inflight []flight            // collectives started, oldest first
	micro    int                 // micro-batch index within the step
	micros   int                 // micro-batches per step
	scaler   scaler
	cz       *compressor // gradient compression, nil when none
	err      error       // the first collective that failed
}

type liveUnit struct {
	raw  comm.Buffer // gathered working parameters, before decoding
	f32  []float32
	h    *comm.Handle
	refs int
	pool bool // f32 came from the pool (else it is raw's memory)
}

// flight is a collective in progress and what to do when it has finished.
type flight struct {
	h     *comm.Handle
	after func()
}

// New builds rank's engine for a model of mcfg over c (nil for one rank),
// with parameters initialised from flat (mcfg.NumParams() fp32 values, the
// same on every rank; the engine keeps its own copies).
func New(cfg Config, mcfg model.Config, c *comm.Communicator, flat []float32) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ranks, rank := 1, 0
	if c != nil {
		ranks, rank = c.Size(), c.Rank()
	}
	// The context of collectives until Bind: a library default, replaced
	// by the run's before any collective is issued.
	ctx := context.Background()
	e := &Engine{cfg: cfg, mcfg: mcfg, units: mcfg.Units(), params: mcfg.Params(), comm: c, ctx: ctx,
		live: map[int]*liveUnit{}, open: map[int][]float32{}, send: map[int]comm.Buffer{}, micros: 1}
	e.part = partition(cfg, e.units, ranks, rank)
	segs := e.part.Segments
	e.segOf = make([]int, len(e.units))
	for i, s := range segs {
		for u := s.First; u <= s.Last; u++ {
			e.segOf[u] = i
		}
	}
	e.done = make([]int, len(segs))
	e.fresh = make([]bool, len(e.units))
	for u := range e.fresh { // the gradients start at zero
		e.fresh[u] = true
	}
	e.pieces = e.part.pieces(e.params)
	e.opt = optim.NewAdamW(cfg.Optim, e.part.Size(), nil)
	e.scaler = newScaler(cfg.Scaler, cfg.Params == comm.Float16)
	e.allocate(len(flat))
	e.setParams(flat)
	e.cz = newCompressor(cfg.Compress, c, e.part.Segments, e.params, len(flat))
	return e, nil
}

// partition is what rank of ranks owns: buckets of units (stages 0–2) or
// single units (stage 3), split over the ranks, except at stage 0 where
// every rank owns everything.
func partition(cfg Config, units []model.Unit, ranks, rank int) Partition {
	segs := Buckets(units, cfg.FirstBucket, cfg.Bucket)
	if cfg.Stage == 3 {
		segs = PerUnit(units)
	}
	if cfg.Stage == 0 {
		ranks, rank = 1, 0
	}
	return NewPartition(segs, ranks, rank)
}

// allocate makes the persistent buffers of the configured stage.
func (e *Engine) allocate(n int) {
	cfg, owned := e.cfg, e.part.Size()
	if cfg.Stage < 3 {
		e.work = comm.NewBuffer(cfg.Params, n)
	} else {
		e.own = comm.NewBuffer(cfg.Params, owned)
	}
	switch {
	case cfg.Params != comm.Float32:
		e.master = make([]float32, owned)
	case cfg.Stage == 3:
		e.master = e.own.Float32s()
	}
	if cfg.Stage < 2 {
		e.grads = comm.NewBuffer(cfg.Grads, n)
	} else {
		e.ownGrad = comm.NewBuffer(cfg.Grads, owned)
	}
}

// setParams takes this rank's copies of the parameters from flat.
func (e *Engine) setParams(flat []float32) {
	for _, pc := range e.pieces {
		copy(e.masterOf(pc), flat[pc.lo:pc.lo+pc.n])
	}
	if e.work.Len() > 0 {
		e.encodeAll(e.work, flat)
	}
	if e.cfg.Stage == 3 && e.cfg.Params != comm.Float32 {
		e.encodeAll(e.own, e.master)
	}
}

// masterOf is the fp32 master copy of an owned piece: in the master
// buffer, or, for fp32 stages 0–2, in the working parameters themselves.
func (e *Engine) masterOf(pc piece) []float32 {
	if e.master == nil {
		return e.work.Float32s()[pc.lo : pc.lo+pc.n]
	}
	return e.master[pc.at : pc.at+pc.n]
}

// Bind makes ctx the context of the engine's collectives: when it ends,
// they fail instead of waiting for peers.
func (e *Engine) Bind(ctx context.Context) { e.ctx = ctx }

// Ranks is the number of data-parallel ranks.
func (e *Engine) Ranks() int {
	if e.comm == nil {
		return 1
	}
	return e.comm.Size()
}

// Optimizer is the AdamW state of the owned parameters.
func (e *Engine) Optimizer() *optim.AdamW { return e.opt }

// Partition is which parameters this rank owns.
func (e *Engine) Partition() Partition { return e.part }

// Memory is the bytes a rank holds for model state, by category, and for
// communication and conversion buffers.
type Memory struct {
	Params    int64 `json:"params"`    // working parameters (all of them, or the owned part in stage 3)
	Grads     int64 `json:"grads"`     // gradients (all, or the owned part in stages 2–3)
	Optimizer int64 `json:"optimizer"` // fp32 master weights when separate, the Adam moments, gradient compression's state
	Buffers   int64 `json:"buffers"`   // buckets, gathered layers, fp32 scratch: the most ever held
}

// Memory reports what e holds now.
func (e *Engine) Memory() Memory {
	m := Memory{
		Params:    int64(len(e.work.Bytes()) + len(e.own.Bytes())),
		Grads:     int64(len(e.grads.Bytes()) + len(e.ownGrad.Bytes())),
		Optimizer: int64(len(e.opt.M)+len(e.opt.V)) * 4,
		Buffers:   e.pool.bytes,
	}
	if e.cfg.Params != comm.Float32 { // a separate master copy
		m.Optimizer += int64(len(e.master)) * 4
	}
	m.Optimizer += e.cz.bytes()
	return m
}
