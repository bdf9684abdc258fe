package train

import (
	"fmt"

	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/internal/usage"
)

// ModelParallel is tp × pp, the ranks of one model replica: above 1 the
// trainer runs tensor and pipeline parallelism (see Parallel), at 1 data
// parallelism and ZeRO as it always did.
func (p Parallel) ModelParallel() int { return max(p.TP, 1) * max(p.PP, 1) }

// SP reports whether the run is sequence-parallel: as set, else on when
// tp > 1.
func (p Parallel) SP() bool {
	if p.SequenceParallel != nil {
		return *p.SequenceParallel && p.TP > 1
	}
	return p.TP > 1
}

// validateGrid checks the tensor- and pipeline-parallel settings against
// the model c, and refuses, saying what to use instead, what the engine
// does not run with tp·pp > 1 yet.
func (s Spec) validateGrid(c model.Config) error {
	p := s.Parallel
	tp, pp := max(p.TP, 1), max(p.PP, 1)
	switch {
	case p.VirtualStages < 0:
		return fmt.Errorf("job: parallel.virtual_stages %d: must not be negative", p.VirtualStages)
	case c.Heads%tp != 0:
		return fmt.Errorf("job: parallel.tp %d: does not divide the model's %d attention heads (model.heads): choose a tp that divides them", tp, c.Heads)
	case c.Vocab < tp:
		return fmt.Errorf("job: parallel.tp %d: more than the model's vocabulary of %d tokens (model.vocab): choose a smaller tp", tp, c.Vocab)
	case pp > c.Layers:
		return fmt.Errorf("job: parallel.pp %d: more pipeline stages than the model's %d layers (model.layers): choose pp of at most %d", pp, c.Layers, c.Layers)
	}
	if err := s.validateChunks(c); err != nil {
		return err
	}
	if len(p.PPLayers) > 0 || pp > 1 {
		if _, err := pipeline.Split(c.Layers, pp*p.chunks(), p.PPLayers); err != nil {
			if p.chunks() > 1 { // Megatron-LM splits the model into pp × v chunks
				return fmt.Errorf("job: parallel.pp_layers (one count per virtual stage, pp × virtual_stages = %d): %w", pp*p.chunks(), err)
			}
			return fmt.Errorf("job: parallel.pp_layers: %w", err)
		}
	}
	if p.ModelParallel() == 1 {
		return nil
	}
	layout := fmt.Sprintf("parallel.tp %d × parallel.pp %d", tp, pp)
	switch n := s.Batch.MicroBatch * s.SeqLen(c); {
	case p.ZeroStage > 1:
		return fmt.Errorf("job: parallel.zero_stage %d with %s: ZeRO stages 2 and 3 do not combine with tensor or pipeline parallelism (DeepSpeed refuses them with pipeline parallelism too): set parallel.zero_stage to 1, Megatron-LM's distributed optimizer", p.ZeroStage, layout)
	case p.SP() && n%tp != 0:
		return fmt.Errorf("job: batch.micro_batch %d × batch.seq %d = %d tokens do not divide over parallel.tp %d, as sequence parallelism needs: choose a micro-batch or seq that makes them divide, or set parallel.sequence_parallel to false", s.Batch.MicroBatch, s.SeqLen(c), n, tp)
	}
	return nil
}

// validateChunks refuses the virtual stages the interleaved schedule
// cannot run (Megatron-LM's rules), saying what to use instead.
func (s Spec) validateChunks(c model.Config) error {
	p := s.Parallel
	v, pp := p.chunks(), max(p.PP, 1)
	switch {
	case v == 1:
		return nil
	case v > pipeline.MaxChunks:
		return fmt.Errorf("job: parallel.virtual_stages %d: at most %d model chunks per rank", v, pipeline.MaxChunks)
	case pp < 2:
		return fmt.Errorf("job: parallel.virtual_stages %d with parallel.pp %d: the interleaved schedule needs at least 2 pipeline stages: set parallel.pp to 2 or more, or parallel.virtual_stages to 1", v, pp)
	case pp*v > c.Layers:
		fix := fmt.Sprintf("choose virtual_stages of at most %d", c.Layers/pp)
		if c.Layers/pp < 2 {
			fix = "set parallel.virtual_stages to 1 (the 1F1B schedule) or a lower parallel.pp"
		}
		return fmt.Errorf("job: parallel.virtual_stages %d: parallel.pp %d × %d = %d model chunks, more than the model's %d layers (model.layers): %s",
			v, pp, v, pp*v, c.Layers, fix)
	case s.Batch.GradAccum%pp != 0:
		return fmt.Errorf("job: parallel.virtual_stages %d: batch.grad_accum %d micro-batches is not a multiple of parallel.pp %d, as the interleaved schedule needs (Megatron-LM's rule): set batch.grad_accum to a multiple of %d, or parallel.virtual_stages to 1",
			v, s.Batch.GradAccum, pp, pp)
	}
	return nil
}

// chunks is the model chunks per pipeline rank: parallel.virtual_stages,
// 0 meaning 1.
func (p Parallel) chunks() int { return max(p.VirtualStages, 1) }

// ppSplit is the layers of each pipeline stage of the resolved spec s, or
// of each virtual stage (pp × virtual_stages of them) when interleaved.
func (s Spec) ppSplit() ([]int, error) {
	return pipeline.Split(s.Model.Config.Layers, s.Parallel.PP*s.Parallel.chunks(), s.Parallel.PPLayers)
}

// fitDP makes parallel.dp the run's rank count over tp × pp (the model
// replicas). A spec written for another count is an error, except on
// resume, where the micro-batch is rescaled so that the global batch (and
// so the data order and the loss curve) stays the checkpoint's.
func fitDP(spec Spec, env Env) (Spec, error) {
	p := &spec.Parallel
	mp := p.ModelParallel()
	if env.World%mp != 0 {
		return spec, fmt.Errorf("train: parallel.tp %d × parallel.pp %d = %d ranks per model replica do not divide the run's %d ranks: run a multiple of %d ranks, or choose tp and pp whose product divides %d (gtrain resume takes --set parallel.tp=… --set parallel.pp=…)",
			p.TP, p.PP, mp, env.World, mp, env.World)
	}
	dp := env.World / mp
	if p.DP == 0 || p.DP == dp {
		p.DP = dp
		return spec, nil
	}
	b := &spec.Batch
	rows := b.MicroBatch * p.DP // sequences per micro-step, over all replicas
	if !env.Resume {
		if mp > 1 {
			return spec, fmt.Errorf("train: parallel.dp %d, but the run's %d ranks make %d replicas of tp %d × pp %d: set parallel.dp to %d or to 0 (every replica)", p.DP, env.World, dp, p.TP, p.PP, dp)
		}
		return spec, fmt.Errorf("train: parallel.dp %d, but the run has %d ranks: set parallel.dp to %d or to 0 (every rank)", p.DP, env.World, env.World)
	}
	if rows%dp != 0 {
		return spec, fmt.Errorf("train: resume on %d ranks (dp %d): the checkpoint's %d sequences per micro-step (micro_batch %d × dp %d) do not divide over %d replicas; resume on a layout whose dp divides %d",
			env.World, dp, rows, b.MicroBatch, p.DP, dp, rows)
	}
	if env.Rank == 0 && env.Log != nil {
		fmt.Fprintf(env.Log, "resharding: dp %d → %d, micro_batch %d → %d (the global batch stays %d sequences)\n",
			p.DP, dp, b.MicroBatch, rows/dp, rows*b.GradAccum)
	}
	b.MicroBatch, p.DP = rows/dp, dp
	return spec, nil
}

// FitDP is spec with parallel.dp resolved for a run of world ranks as
// the ranks resolve it when they resume (fitDP): dp 0 becomes every
// replica, and another dp is resharded, the micro-batch rescaled to keep
// the global batch. The launcher names the layout the ranks run with it.
func FitDP(spec Spec, world int) (Spec, error) {
	return fitDP(spec, Env{World: world, Resume: true})
}

// CheckLayout refuses, before any rank starts, a spec whose tp × pp and dp
// do not fit a run of world ranks: the error each rank would give at
// setup (fitDP), as a usage error. A resume may change dp (the micro-batch
// is rescaled), a fresh run may not.
func CheckLayout(spec Spec, world int, resume bool) error {
	if _, err := fitDP(spec, Env{World: world, Resume: resume}); err != nil {
		return &usage.Error{Err: err}
	}
	return nil
}

// gridChunkInFlight is, under the interleaved schedule, the activation
// sets each of stage's chunks keeps (pipeline.Schedule.ChunkInFlight): the
// most over the schedules the trainer runs, training's and evaluation's
// (a full evalChunk and the remainder, each padded by evalMicros), since a
// chunk's sets are kept once made. Nil with one chunk (gridInFlight
// counts), or for a spec whose schedules cannot run (validateGrid says
// why).
func gridChunkInFlight(spec Spec, stage int) []int {
	p := spec.Parallel
	v := p.chunks()
	if v == 1 {
		return nil
	}
	micros := []int{spec.Batch.GradAccum}
	if b := spec.Eval.Batches; spec.Eval.Every > 0 && b > 0 {
		micros = append(micros, evalMicros(min(evalChunk, b), p.PP, v))
		if r := b % evalChunk; b > evalChunk && r > 0 {
			micros = append(micros, evalMicros(r, p.PP, v))
		}
	}
	sets := make([]int, v)
	for _, m := range micros {
		sched, err := scheduleOf(p.PP, m, v)
		if err != nil {
			return nil
		}
		for c, n := range sched.ChunkInFlight(stage) {
			sets[c] = max(sets[c], n)
		}
	}
	return sets
}

// Schedule names the pipeline schedule the layout runs, for the launcher
// to print: "interleaved 1F1B, v model chunks per rank" with virtual
// stages, "1F1B" with a pipeline, "" without one.
func (p Parallel) Schedule() string {
	switch {
	case p.PP > 1 && p.chunks() > 1:
		return fmt.Sprintf("interleaved 1F1B, %d model chunks per rank", p.chunks())
	case p.PP > 1:
		return "1F1B"
	}
	return ""
}
