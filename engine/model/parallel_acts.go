package model

import (
	"fmt"

	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
)

// stageActs are what one micro-batch's forward keeps for its backward.
// res[i] is local block i's input: on the first stage the embedding's
// output, elsewhere (i = 0) Run's input buffer, which Run keeps unchanged
// until the backward; res[layers] is the final LayerNorm's input on the
// last stage (elsewhere the last block writes Run's output buffer). Under
// full recomputation layers is empty: the block inputs are all it keeps.
type stageActs struct {
	x, y                  []int32 // the micro-batch's inputs (first stage) and targets (last)
	res                   [][]float32
	layers                []layerActs
	lnf, lnfMean, lnfRstd []float32
	probs                 []float32 // N×vs: the logits, then softmax, then their gradient
	losses                []float32
}

// stageScratch are the buffers one pass at a time uses.
type stageScratch struct {
	proj        []float32 // rows×C: c_proj outputs, consumed at once by the residual add
	dres, dln   []float32 // rows×C
	dqkv, datty []float32
	dfch, dgelu []float32 // N×hw
	att         []float32 // attention backward's scratch
}

func (s *Stage) newStageScratch(z *sizer, attScratch int) stageScratch {
	d, C, o := s.dims, s.Config.Embd, &z.use.Other
	return stageScratch{
		proj: z.floats(o, d.rows*C), dres: z.floats(o, d.rows*C), dln: z.floats(o, d.rows*C),
		dqkv: z.floats(o, d.N*3*d.cw), datty: z.floats(o, d.N*d.cw),
		dfch: z.floats(o, d.N*d.hw), dgelu: z.floats(o, d.N*d.hw), att: z.floats(o, attScratch),
	}
}

// ints allocates n int32s (token ids), counted in *part.
func (z *sizer) ints(part *int64, n int) []int32 {
	*part += int64(n) * 4
	if z.dry {
		return nil
	}
	return make([]int32, n)
}

// newLayerActs allocates one block's activations, the kept ones counted in
// *kept and the LayerNorm statistics in Other (as the planner, after
// Korthikanti et al., leaves them out). Under selective recomputation the
// probabilities are the stage's one shared buffer (s.work.att).
func (s *Stage) newLayerActs(z *sizer, kept *int64) layerActs {
	d, C, o := s.dims, s.Config.Embd, &z.use.Other
	la := layerActs{
		ln1: z.floats(kept, d.rows*C), ln1Mean: z.floats(o, d.rows), ln1Rstd: z.floats(o, d.rows),
		qkv: z.floats(kept, d.N*3*d.cw), atty: z.floats(kept, d.N*d.cw),
		res2: z.floats(kept, d.rows*C), ln2: z.floats(kept, d.rows*C), ln2Mean: z.floats(o, d.rows),
		ln2Rstd: z.floats(o, d.rows), fch: z.floats(kept, d.N*d.hw), fchGelu: z.floats(kept, d.N*d.hw),
	}
	if s.rc == RecomputeSelective {
		la.att = s.work.att
	} else {
		la.att = z.floats(kept, s.B*d.nh*s.T*s.T)
	}
	return la
}

// newWork allocates what the stage shares between its micro-batches:
// recomputation's working set (full: one block's activations, refilled
// for each block just before its backward; selective: one block's
// probabilities) and backward's scratch.
func (s *Stage) newWork(z *sizer, attScratch int) {
	switch s.rc {
	case RecomputeFull:
		s.work = s.newLayerActs(z, &z.use.Working)
	case RecomputeSelective:
		s.work.att = z.floats(&z.use.Working, s.B*s.dims.nh*s.T*s.T)
	}
	s.sc = s.newStageScratch(z, attScratch)
}

// newActs allocates one micro-batch's activations (a dry z only counts
// them). Block 0's input on a stage after the first is Run's buffer: not
// allocated here, but counted, since the stage keeps it until the
// backward as the planner counts a stage's input.
func (s *Stage) newActs(z *sizer) *stageActs {
	d, C, u := s.dims, s.Config.Embd, &z.use
	a := &stageActs{res: make([][]float32, d.layers+1)}
	for i := range d.layers {
		if i > 0 || d.isFirst {
			a.res[i] = z.floats(&u.Layers, d.rows*C)
		} else {
			u.Layers += 4 * int64(d.rows*C)
		}
		if s.rc != RecomputeFull {
			a.layers = append(a.layers, s.newLayerActs(z, &u.Layers))
		}
	}
	if d.isFirst {
		a.x = z.ints(&u.Other, d.N)
	}
	if d.isLast {
		a.y = z.ints(&u.Other, d.N)
		a.res[d.layers] = z.floats(&u.Head, d.rows*C)
		a.lnf, a.lnfMean, a.lnfRstd = z.floats(&u.Head, d.rows*C), z.floats(&u.Other, d.rows), z.floats(&u.Other, d.rows)
		a.probs, a.losses = z.floats(&u.Head, d.N*d.vs), z.floats(&u.Other, d.N)
	}
	return a
}

// layer returns the buffers block i of a uses: its own, or under full
// recomputation the shared set.
func (s *Stage) layer(a *stageActs, i int) *layerActs {
	if s.rc == RecomputeFull {
		return &s.work
	}
	return &a.layers[i]
}

// take returns a free activation set for micro, making one when every set
// is in flight: the schedule decides how many there are.
func (s *Stage) take(micro int) (*stageActs, error) {
	if _, ok := s.inflight[micro]; ok {
		return nil, fmt.Errorf("model: stage %d: forward of micro-batch %d again before its backward", s.index, micro)
	}
	var a *stageActs
	if k := len(s.free); k > 0 {
		a, s.free = s.free[k-1], s.free[:k-1]
	} else {
		a = s.newActs(&sizer{})
		s.allocated++
	}
	s.inflight[micro] = a
	return a, nil
}

// release returns micro's activations to the free list.
func (s *Stage) release(micro int) {
	if a, ok := s.inflight[micro]; ok {
		delete(s.inflight, micro)
		if !s.dims.isFirst {
			a.res[0] = nil // Run's buffer, not ours
		}
		s.free = append(s.free, a)
	}
}

// ActivationUse is what the stage's activation buffers hold, by part, in
// the planner's terms: Layers and Head for each micro-batch whose
// activations it has allocated (the most the schedule had in flight so
// far; none before the first forward), block 0's input on a stage after
// the first included (Run's buffer, which the stage keeps), then the
// shared working set and scratch. Parameters and gradients are not in it.
// With several chunks, each chunk's sets are counted apart (chunkUse).
func (s *Stage) ActivationUse() ActivationUse {
	var uses []stageUse
	var sets []int
	for _, c := range s.chunks() {
		uses, sets = append(uses, c.use), append(sets, c.allocated)
	}
	return chunkUse(uses, sets)
}

// ActivationBytes is the total of ActivationUse.
func (s *Stage) ActivationBytes() int64 { return s.ActivationUse().Total() }

// stageUse is a stage's activation memory: perSet for each micro-batch in
// flight, shared once.
type stageUse struct{ perSet, shared ActivationUse }

// times is u with sets activation sets.
func (u stageUse) times(sets int) ActivationUse {
	n := int64(sets)
	return ActivationUse{
		Layers:  u.shared.Layers + n*u.perSet.Layers,
		Head:    u.shared.Head + n*u.perSet.Head,
		Working: u.shared.Working + n*u.perSet.Working,
		Other:   u.shared.Other + n*u.perSet.Other,
	}
}

// StageShape is where one rank's Stage sits, all that sizes its
// activations: the model and micro-batch, its place in the TP group and
// the pipeline, the recomputation mode, and the micro-batches it holds at
// once.
type StageShape struct {
	Config           Config
	B, T             int
	TP, TPRank       int // the TP degree and this rank's index in its group
	SequenceParallel bool
	Split            []int // layers per pipeline stage (pipeline.Split); per virtual stage with Chunks > 1
	Stage            int
	Recompute        Recompute
	// InFlight is the micro-batches whose activations the stage keeps at
	// once: pipeline.Schedule.InFlight(Stage), min(pp − Stage, micro-
	// batches) under 1F1B; at most pp − Stage.
	InFlight int
	// Chunks is the model chunks per rank (0 or 1: one, and InFlight
	// counts); above 1, ChunkInFlight gives the activation sets each chunk
	// keeps (pipeline.Schedule.ChunkInFlight(Stage)), one count per chunk.
	Chunks        int
	ChunkInFlight []int
}

// StageActivationUseOf is Stage.ActivationUse of the rank sh describes
// with sh.InFlight activation sets and a backend whose AttentionScratch(T)
// is attScratch, computed by the code that allocates them, without
// allocating: so that a job can be checked against memory before its
// stages are built.
func StageActivationUseOf(sh StageShape, attScratch int) (ActivationUse, error) {
	if err := checkShape(sh.Config, sh.B, sh.T); err != nil {
		return ActivationUse{}, err
	}
	split, err := pipeline.Split(sh.Config.Layers, len(sh.Split), sh.Split)
	if err != nil {
		return ActivationUse{}, fmt.Errorf("model: stage: %w", err)
	}
	rc, err := ParseRecompute(string(sh.Recompute))
	if err != nil {
		return ActivationUse{}, err
	}
	sets, err := shapeSets(sh, len(split))
	if err != nil {
		return ActivationUse{}, err
	}
	rows, err := sequenceRows(sh.B*sh.T, sh.TP, sh.SequenceParallel)
	if err != nil {
		return ActivationUse{}, err
	}
	pp := len(split) / len(sets)
	uses := make([]stageUse, len(sets))
	var bytes float64
	for c := range sets {
		vs := c*pp + sh.Stage
		first, end := pipeline.Layers(split, vs)
		s := &Stage{Config: sh.Config, B: sh.B, T: sh.T, rc: rc, index: vs, first: first, end: end}
		if s.dims, err = stageDimsOf(sh.Config, sh.B*sh.T, rows, sh.TPRank, sh.TP, vs, len(split), end-first); err != nil {
			return ActivationUse{}, err
		}
		uses[c] = s.countUse(attScratch)
		if c > 0 {
			uses[c].shared = ActivationUse{} // the rank's one working set and scratch
		}
		bytes += float64(uses[c].perSet.Total())*float64(sets[c]) + float64(uses[c].shared.Total())
	}
	// Every buffer is below maxBufferFloats, but a deep stage's sets
	// together could still pass an int64.
	if bytes > 1<<62 {
		return ActivationUse{}, fmt.Errorf("model: stage %d: %v micro-batches of %d×%d tokens in flight need over 2^62 bytes of activations: use a smaller batch.micro_batch or batch.seq", sh.Stage, sets, sh.B, sh.T)
	}
	return chunkUse(uses, sets), nil
}

// shapeSets is the activation sets of each chunk of sh, a rank of a split
// into virtual stages, or why sh cannot be a rank's.
func shapeSets(sh StageShape, virtual int) ([]int, error) {
	pp, err := chunkedStages(virtual, sh.Chunks)
	if err != nil {
		return nil, err
	}
	if sh.Stage < 0 || sh.Stage >= pp {
		return nil, fmt.Errorf("model: stage %d of %d: out of range", sh.Stage, pp)
	}
	if max(sh.Chunks, 1) == 1 {
		if sh.InFlight < 0 || sh.InFlight > pp-sh.Stage {
			return nil, fmt.Errorf("model: stage %d of %d with %d micro-batches in flight: want at most %d in flight (1F1B's)",
				sh.Stage, pp, sh.InFlight, pp-sh.Stage)
		}
		return []int{sh.InFlight}, nil
	}
	if len(sh.ChunkInFlight) != sh.Chunks {
		return nil, fmt.Errorf("model: stage %d: %d in-flight counts for %d chunks: give one per chunk", sh.Stage, len(sh.ChunkInFlight), sh.Chunks)
	}
	for c, n := range sh.ChunkInFlight {
		if n < 0 || n > pipeline.MaxMicros {
			return nil, fmt.Errorf("model: stage %d: chunk %d with %d micro-batches in flight: want 0 to %d", sh.Stage, c, n, pipeline.MaxMicros)
		}
	}
	return sh.ChunkInFlight, nil
}

// countUse counts, without allocating, one activation set and the shared
// buffers.
func (s *Stage) countUse(attScratch int) stageUse {
	shared, set := sizer{dry: true}, sizer{dry: true}
	work, sc := s.work, s.sc
	s.newWork(&shared, attScratch)
	s.work, s.sc = work, sc
	s.newActs(&set)
	return stageUse{perSet: set.use, shared: shared.use}
}

// sequenceRows is tensorpar.Group.SequenceRows's count for a group of tp
// ranks: n/tp rows each with sequence parallelism, n without.
func sequenceRows(n, tp int, sp bool) (int, error) {
	if tp < 1 {
		return 0, fmt.Errorf("model: stage: tp %d: want at least 1", tp)
	}
	if !sp || tp == 1 {
		return n, nil
	}
	if n%tp != 0 {
		return 0, fmt.Errorf("model: stage: sequence parallelism: %d tokens (batch × sequence) do not divide by tp %d", n, tp)
	}
	return n / tp, nil
}

// stageDimsOf is the widths of TP rank rank of tp on stage of stages,
// holding layers blocks, for micro-batches of n tokens of which it holds
// rows between the TP regions: the parts tensorpar.Part cuts of the
// vocabulary (the token embedding's rows), the attention (c_attn's q|k|v
// heads) and the MLP (c_fc's columns).
func stageDimsOf(cfg Config, n, rows, rank, tp, stage, stages, layers int) (stageDims, error) {
	d := stageDims{N: n, rows: rows, layers: layers, isFirst: stage == 0, isLast: stage == stages-1}
	if tp < 1 || rank < 0 || rank >= tp || cfg.Heads%tp != 0 {
		return d, fmt.Errorf("model: stage: tp rank %d of %d: want a rank in range and a tp that divides the %d heads", rank, tp, cfg.Heads)
	}
	d.nh = cfg.Heads / tp
	// The three tensors as Config.Params names and shapes them, without
	// listing every tensor: a memory check sizes each stage of a deep
	// pipeline.
	C := cfg.Embd
	wte := Param{Name: "transformer.wte.weight", Shape: []int{cfg.Vocab, C}}
	qkvb := Param{Name: "transformer.h.0.attn.c_attn.bias", Shape: []int{3 * C}}
	fcb := Param{Name: "transformer.h.0.mlp.c_fc.bias", Shape: []int{4 * C}}
	width := func(p Param) (int, error) {
		shape, err := tensorpar.Part{Split: tensorpar.SplitOf(p.Name), Rank: rank, Size: tp, Heads: cfg.Heads}.Shape(p.Shape)
		if err != nil {
			return 0, fmt.Errorf("model: stage %d: %s: %w", stage, p.Name, err)
		}
		return shape[0], nil
	}
	var err error
	if d.isFirst || d.isLast {
		if d.vs, err = width(wte); err != nil { // this rank's vocabulary rows
			return d, err
		}
	}
	if d.cw, err = width(qkvb); err != nil {
		return d, err
	}
	d.cw /= 3
	d.hw, err = width(fcb)
	return d, err
}
