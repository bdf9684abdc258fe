package model

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
)

// StageSpec is what NewStage builds one rank's part of a tensor- and
// pipeline-parallel GPT-2 from.
type StageSpec struct {
	Config Config
	B, T   int // the micro-batch: B sequences of T tokens
	// TP is this rank's tensor-parallel group, whose backend computes
	// (tensorpar.NewGroup(nil, be, false) for a rank without TP).
	TP *tensorpar.Group
	// Split is the number of layers of each pipeline stage (pipeline.Split)
	// and Stage this rank's stage (parallel.Groups.Coord.PP). With Chunks
	// v > 1 (the interleaved schedule), Split counts the layers of each of
	// the pp·v virtual stages, and the rank holds v model chunks, chunk c
	// being virtual stage c·pp + Stage (Megatron-LM's assignment).
	Split  []int
	Stage  int
	Chunks int // model chunks per rank: 0 or 1 for one, v for interleaving
	// Batch returns micro-batch micro's B×T inputs and targets. The first
	// stage calls it for the inputs, the last for the targets, once per
	// forward; a middle stage never does (it may be nil there).
	Batch func(micro int) (x, y []int32, err error)
	// Recompute is what the stage drops after a micro-batch's forward and
	// computes again just before its backward, as the dense Model's modes
	// define it ("" is none).
	Recompute Recompute
}

// ShardParam is one tensor a Stage holds: this TP rank's part of a full
// GPT-2 parameter.
type ShardParam struct {
	// Param is the part: its name (the full tensor's), shape, offset into
	// Stage.Params and Stage.Grads, and whether weight decay applies.
	Param
	// Full is the whole tensor in Config.Params' flat layout.
	Full Param
	// Part says which part of Full this is (tensorpar.SplitOf the name).
	Part tensorpar.Part
}

// Stage is one rank's part of a GPT-2 trained with Megatron-LM's tensor
// parallelism (optionally sequence-parallel) and pipeline parallelism: the
// layers of its pipeline stage, the token and position embeddings on the
// first stage, the final LayerNorm and the tied output layer (the token
// embedding again) on the last, each parameter as this TP rank's part of
// the Hugging Face tensor. It implements pipeline.Stage for one model
// chunk: Forward and Backward run one micro-batch, keeping the
// activations of every micro-batch whose backward has not run yet (the
// schedule's InFlight of them at most): all of them, or under
// recomputation (StageSpec.Recompute) all but each block's attention
// probabilities (selective) or only each block's input (full), the rest
// rebuilt one block at a time in the backward into buffers the
// micro-batches share.
//
// A step is ZeroGrad, pipeline.Run over the step's micro-batches, then
// ReduceNorms and ReduceTied, after which Grads holds this rank's part of
// the gradient of DLoss × the sum of the micro-batches' mean losses.
type Stage struct {
	Config Config
	B, T   int
	// Params and Grads are this rank's parts of the parameters and their
	// gradients, flat, in Shards order.
	Params, Grads []float32
	// DLoss is the gradient of the step's loss with respect to each
	// micro-batch's mean loss, as Model.Backward's dloss: 1/m for m
	// micro-batches per step (times a loss scale). NewStage sets 1.
	DLoss float32

	tp            *tensorpar.Group
	be            backend.Backend
	rc            Recompute
	batch         func(micro int) (x, y []int32, err error)
	index, stages int
	first, end    int // the layers held: [first, end)
	shards        []ShardParam
	w, g          stageViews
	dims          stageDims
	lin           stageLinears
	sc            stageScratch
	work          layerActs // recomputation's shared block buffers (see newWork)
	use           stageUse
	free          []*stageActs
	inflight      map[int]*stageActs
	allocated     int // activation sets made: the most micro-batches in flight
	losses        []float32
	normBuf       []float32
	// more are chunks 1 … v−1 of an interleaved rank (this Stage being
	// chunk 0): one-chunk Stages sharing its Params, Grads, working set
	// and scratch (see pack).
	more []*Stage
}

// stageDims are a rank's widths: rows of the sequence-parallel
// activations, and its parts of the attention, MLP and vocabulary.
type stageDims struct {
	N, rows         int // token rows of a micro-batch, and of this rank's shard
	cw, nh, hw      int // attention width and heads, MLP hidden width
	vs              int // vocabulary rows of wte (0 on a middle stage)
	layers          int // end − first
	isFirst, isLast bool
}

// stageLinears are the shapes of the TP layers.
type stageLinears struct {
	qkv, attProj, fc, fcProj, head tensorpar.Linear
}

// stageViews slice a stage's flat parameters (or gradients) into tensors;
// the embeddings and the final LayerNorm are nil where the stage has none.
type stageViews struct {
	wte, wpe   []float32
	blocks     []layerWeights
	lnfw, lnfb []float32
}

// tensorsPerBlock is the number of tensors of a block in Config.Params.
const tensorsPerBlock = 12

// NewStage builds this rank's stage of spec, its parameters zero until
// LoadFull.
func NewStage(spec StageSpec) (*Stage, error) {
	cfg := spec.Config
	if err := checkShape(cfg, spec.B, spec.T); err != nil {
		return nil, err
	}
	if err := checkStageSpec(spec); err != nil {
		return nil, err
	}
	rc, err := ParseRecompute(string(spec.Recompute))
	if err != nil {
		return nil, err
	}
	v := max(spec.Chunks, 1)
	pp := len(spec.Split) / v
	s, err := newChunk(spec, rc, spec.Stage)
	if err != nil {
		return nil, err
	}
	for c := 1; c < v; c++ {
		t, err := newChunk(spec, rc, c*pp+spec.Stage)
		if err != nil {
			return nil, err
		}
		s.more = append(s.more, t)
	}
	s.pack(s.be.AttentionScratch(spec.T))
	return s, nil
}

// newChunk lays out virtual stage vs of spec as a one-chunk Stage, without
// its parameters or buffers (pack allocates them).
func newChunk(spec StageSpec, rc Recompute, vs int) (*Stage, error) {
	first, end := pipeline.Layers(spec.Split, vs)
	s := &Stage{Config: spec.Config, B: spec.B, T: spec.T, DLoss: 1, tp: spec.TP, be: spec.TP.Backend(), batch: spec.Batch, rc: rc,
		index: vs, stages: len(spec.Split), first: first, end: end, inflight: map[int]*stageActs{}}
	s.dims.isFirst, s.dims.isLast = vs == 0, vs == len(spec.Split)-1
	if err := s.layout(); err != nil {
		return nil, err
	}
	if err := s.setDims(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkStageSpec refuses a spec whose split, stage, group or data source
// cannot work, before anything is allocated.
func checkStageSpec(spec StageSpec) error {
	cfg := spec.Config
	if spec.TP == nil {
		return errors.New("model: stage: no tensor-parallel group (tensorpar.NewGroup(nil, backend, false) for a rank without TP)")
	}
	if _, err := pipeline.Split(cfg.Layers, len(spec.Split), spec.Split); err != nil {
		return fmt.Errorf("model: stage: %w", err)
	}
	pp, err := chunkedStages(len(spec.Split), spec.Chunks)
	if err != nil {
		return err
	}
	if spec.Stage < 0 || spec.Stage >= pp {
		return fmt.Errorf("model: stage %d: out of range for %d pipeline stages", spec.Stage, pp)
	}
	tp := spec.TP.Size()
	if cfg.Heads%tp != 0 {
		return fmt.Errorf("model: stage: tp %d does not divide the %d attention heads: choose a tp that divides the heads", tp, cfg.Heads)
	}
	if cfg.Vocab < tp {
		return fmt.Errorf("model: stage: tp %d is larger than the vocabulary of %d tokens", tp, cfg.Vocab)
	}
	if _, _, err := spec.TP.SequenceRows(spec.B * spec.T); err != nil {
		return fmt.Errorf("model: stage: %w", err)
	}
	if spec.Batch == nil && (spec.Stage == 0 || spec.Stage == pp-1) {
		return fmt.Errorf("model: stage %d of %d: no Batch to read micro-batches from (the first and last stages need one)", spec.Stage, pp)
	}
	return nil
}

// holds reports whether the stage keeps Config.Params()[i]: the token
// embedding on the first and last stages (tied), the position embedding
// on the first, a block's tensors where the block is, the final LayerNorm
// on the last.
func (s *Stage) holds(i int) bool {
	switch nb := tensorsPerBlock * s.Config.Layers; {
	case i == 0:
		return s.dims.isFirst || s.dims.isLast
	case i == 1:
		return s.dims.isFirst
	case i < 2+nb:
		l := (i - 2) / tensorsPerBlock
		return l >= s.first && l < s.end
	}
	return s.dims.isLast
}

// layout lists the parts this rank holds, in Config.Params order, packed.
func (s *Stage) layout() error {
	off := 0
	for i, p := range s.Config.Params() {
		if !s.holds(i) {
			continue
		}
		part := tensorpar.Part{Split: tensorpar.SplitOf(p.Name), Rank: s.tp.Rank(), Size: s.tp.Size(), Heads: s.Config.Heads}
		shape, err := part.Shape(p.Shape)
		if err != nil {
			return fmt.Errorf("model: stage %d: %s: %w", s.index, p.Name, err)
		}
		sp := ShardParam{Param: Param{Name: p.Name, Shape: shape, Offset: off, Decay: p.Decay}, Full: p, Part: part}
		off += sp.Size()
		s.shards = append(s.shards, sp)
	}
	return nil
}

// setDims takes the widths of the parts Part cuts (stageDimsOf, the
// layout's rule), and the rows of this rank's sequence shard from its
// group.
func (s *Stage) setDims() error {
	N := s.B * s.T
	lo, hi, err := s.tp.SequenceRows(N)
	if err != nil {
		return fmt.Errorf("model: stage: %w", err)
	}
	if s.dims, err = stageDimsOf(s.Config, N, hi-lo, s.tp.Rank(), s.tp.Size(), s.index, s.stages, s.end-s.first); err != nil {
		return err
	}
	d, C := s.dims, s.Config.Embd
	s.lin = stageLinears{
		qkv:     tensorpar.Linear{N: d.N, In: C, Out: 3 * d.cw},
		attProj: tensorpar.Linear{N: d.N, In: d.cw, Out: C},
		fc:      tensorpar.Linear{N: d.N, In: C, Out: d.hw},
		fcProj:  tensorpar.Linear{N: d.N, In: d.hw, Out: C},
		head:    tensorpar.Linear{N: d.N, In: C, Out: max(d.vs, 1), Transposed: true},
	}
	return nil
}

// views slices flat (Params or Grads) into the stage's tensors.
func (s *Stage) views(flat []float32) stageViews {
	k := 0
	next := func() []float32 {
		p := s.shards[k]
		k++
		return flat[p.Offset : p.Offset+p.Size() : p.Offset+p.Size()]
	}
	var v stageViews
	if s.dims.isFirst || s.dims.isLast {
		v.wte = next()
	}
	if s.dims.isFirst {
		v.wpe = next()
	}
	for range s.dims.layers {
		v.blocks = append(v.blocks, layerWeights{
			ln1w: next(), ln1b: next(), qkvw: next(), qkvb: next(), attprojw: next(), attprojb: next(),
			ln2w: next(), ln2b: next(), fcw: next(), fcb: next(), fcprojw: next(), fcprojb: next(),
		})
	}
	if s.dims.isLast {
		v.lnfw, v.lnfb = next(), next()
	}
	return v
}

// Shards lists the tensors this rank holds, in the order of Params.
func (s *Stage) Shards() []ShardParam { return s.shards }

// Layers is the range [first, end) of the blocks this stage holds: of its
// first chunk's when it has several (ChunkLayers).
func (s *Stage) Layers() (first, end int) { return s.first, s.end }

// LoadFull sets the stage's parameters to its parts of full, a whole
// model's parameters in Config.Params' flat layout (InitParams's).
func (s *Stage) LoadFull(full []float32) error {
	if n := s.Config.NumParams(); len(full) != n {
		return fmt.Errorf("model: stage: load %d parameters: the model has %d", len(full), n)
	}
	for _, p := range s.shards {
		part, err := p.Part.Extract(full[p.Full.Offset:p.Full.Offset+p.Full.Size()], p.Full.Shape)
		if err != nil {
			return fmt.Errorf("model: stage: load %s: %w", p.Name, err)
		}
		copy(s.Params[p.Offset:p.Offset+p.Size()], part)
	}
	return nil
}

// GradsToFull writes the stage's gradients into their places in full, a
// whole model's gradient in Config.Params' layout; the rest of full is left
// as it is. Done for every rank of the model, it assembles the gradient
// the dense Model computes.
func (s *Stage) GradsToFull(full []float32) error {
	if n := s.Config.NumParams(); len(full) != n {
		return fmt.Errorf("model: stage: gradients into %d elements: the model has %d", len(full), n)
	}
	for _, p := range s.shards {
		if err := p.Part.Insert(full[p.Full.Offset:p.Full.Offset+p.Full.Size()], p.Full.Shape, s.Grads[p.Offset:p.Offset+p.Size()]); err != nil {
			return fmt.Errorf("model: stage: gradient of %s: %w", p.Name, err)
		}
	}
	return nil
}

// ZeroGrad clears the gradients and the recorded losses before a step.
func (s *Stage) ZeroGrad() {
	clear(s.Grads)
	for _, c := range s.chunks() {
		c.losses = c.losses[:0]
	}
}

// Losses are the mean losses of the micro-batches forwarded since
// ZeroGrad, by micro-batch (NaN for one not run), on the last stage; nil
// on the others.
func (s *Stage) Losses() []float32 { return append([]float32(nil), s.last().losses...) }

// record keeps micro-batch micro's loss.
func (s *Stage) record(micro int, loss float32) {
	for len(s.losses) <= micro {
		s.losses = append(s.losses, float32(math.NaN()))
	}
	s.losses[micro] = loss
}

// ReduceNorms completes the LayerNorm gradients after the schedule: under
// sequence parallelism each TP rank computed them from its own token rows
// only, and they are summed over the TP group (one all-reduce of all of
// them). Without sequence parallelism it does nothing.
func (s *Stage) ReduceNorms(ctx context.Context) error {
	if !s.tp.SequenceParallel() || s.tp.Size() == 1 {
		return nil
	}
	var norms [][]float32
	for _, c := range s.chunks() {
		for _, b := range c.g.blocks {
			norms = append(norms, b.ln1w, b.ln1b, b.ln2w, b.ln2b)
		}
		if c.dims.isLast {
			norms = append(norms, c.g.lnfw, c.g.lnfb)
		}
	}
	buf := s.normBuf[:0]
	for _, n := range norms {
		buf = append(buf, n...)
	}
	s.normBuf = buf
	if err := s.tp.ReduceReplicated(ctx, buf); err != nil {
		return fmt.Errorf("model: stage %d: LayerNorm gradients: %w", s.index, err)
	}
	for _, n := range norms {
		buf = buf[copy(n, buf):]
	}
	return nil
}

// ReduceTied sums the tied token embedding's gradient over embed
// (parallel.Groups.Embed) after the schedule: with two or more pipeline
// stages the first stage holds the embedding's copy and the last the
// output layer's, each with its part of the gradient. With one stage, and
// on a middle stage (no copy, embed nil), it does nothing.
func (s *Stage) ReduceTied(ctx context.Context, embed *comm.Communicator) error {
	c := s.tiedChunk()
	if s.stages == 1 || c == nil {
		return nil
	}
	if embed == nil || embed.Size() != 2 {
		return fmt.Errorf("model: stage %d of %d: the tied embedding needs the embedding group of the first and last stage (parallel.Groups.Embed)", s.index, s.stages)
	}
	if err := embed.AllReduce(ctx, comm.F32(c.g.wte), comm.Sum); err != nil {
		return fmt.Errorf("model: stage %d: all-reduce of the tied embedding's gradient: %w", s.index, err)
	}
	return nil
}
