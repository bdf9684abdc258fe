package train

import (
	"context"
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/engine/pipeline"
	"github.com/gtrain/gtrain/engine/tensorpar"
	"github.com/gtrain/gtrain/engine/zero"
	"github.com/gtrain/gtrain/planner"
)

// gridRank is a rank's state under tensor and pipeline parallelism
// (tp·pp > 1): its process groups, its model.Stage (this TP rank's parts
// of its pipeline stage's tensors), the distributed optimizer over its DP
// group, and the step's micro-batches, drawn before the schedule runs so
// that the first stage (inputs) and the last (targets) read the same ones.
type gridRank struct {
	groups *parallel.Groups
	stage  *model.Stage
	opt    *zero.DistOptimizer
	split  []int // layers per pipeline stage (per virtual stage when interleaved)
	chunks int   // model chunks per rank: parallel.virtual_stages, at least 1
	xs, ys [][]int32
}

// buildGrid is build for tp·pp > 1: the groups split from the world, the
// stage loaded from the seed's full initialisation (the same on every
// rank, so every replica starts equal), the optimizer, the sampler of this
// rank's DP replica and the batch buffers.
func (t *Trainer) buildGrid(ctx context.Context) error {
	spec, env, cfg := t.spec, t.env, t.spec.Model.Config
	p := spec.Parallel
	grid := planner.Grid{TP: p.TP, PP: p.PP, DP: p.DP}
	if err := t.interrupted(ctx, "split the process groups"); err != nil {
		return err
	}
	gs, err := parallel.New(ctx, env.Comm, grid)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	g := &gridRank{groups: gs, chunks: p.chunks()}
	t.grid = g
	if g.split, err = spec.ppSplit(); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	flat, err := t.initParams(ctx)
	if err != nil {
		return err
	}
	if err := t.interrupted(ctx, "allocate the pipeline stage"); err != nil {
		return err
	}
	B, T := spec.Batch.MicroBatch, spec.Batch.Seq
	tpg := tensorpar.NewGroup(gs.TP, spec.cpuBackend(env), p.SP())
	g.stage, err = model.NewStage(model.StageSpec{Config: cfg, B: B, T: T, TP: tpg, Split: g.split, Stage: gs.Coord.PP, Chunks: g.chunks,
		Batch: g.batch, Recompute: model.Recompute(spec.Recompute)})
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if err := g.stage.LoadFull(flat); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	dc, err := spec.distConfig()
	if err != nil {
		return err
	}
	if g.opt, err = zero.NewDist(dc, gs, zero.StageTensors(g.stage), g.stage.Params, g.stage.Grads); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return t.buildData(grid)
}

// distConfig is the distributed optimizer's setup: the ZeRO stage, and the
// precision, gradient type and loss scaling as the data-parallel engine
// reads them (ZeroConfig), so that both paths take the same keys alike.
func (s Spec) distConfig() (zero.DistConfig, error) {
	zc, err := s.ZeroConfig()
	if err != nil {
		return zero.DistConfig{}, err
	}
	return zero.DistConfig{Stage: zc.Stage, Params: zc.Params, Grads: zc.Grads, Scaler: zc.Scaler, Optim: zc.Optim}, nil
}

// lossScaler is the rank's fp16 loss scaling, the data-parallel engine's
// or the distributed optimizer's: both are zero's scaler.
type lossScaler interface {
	LossScale() float64
	Scaler() zero.ScalerState
	RestoreScaler(zero.ScalerState)
}

// scaler is the rank's loss scaler: the distributed optimizer's under
// tensor and pipeline parallelism, else the engine's; nil before either
// is built.
func (t *Trainer) scaler() lossScaler {
	switch {
	case t.grid != nil && t.grid.opt != nil:
		return t.grid.opt
	case t.zero != nil:
		return t.zero
	}
	return nil
}

// batch is the stage's source of micro-batches: those the step drew.
func (g *gridRank) batch(micro int) (x, y []int32, err error) {
	if micro < 0 || micro >= len(g.xs) {
		return nil, nil, fmt.Errorf("micro-batch %d of %d drawn", micro, len(g.xs))
	}
	return g.xs[micro], g.ys[micro], nil
}

// buffers makes room for n micro-batches of n tokens each.
func (g *gridRank) buffers(n, tokens int) {
	for len(g.xs) < n {
		g.xs, g.ys = append(g.xs, make([]int32, tokens)), append(g.ys, make([]int32, tokens))
	}
	g.xs, g.ys = g.xs[:n], g.ys[:n]
}

// close releases the groups (not the world).
func (g *gridRank) close() error {
	if g == nil || g.groups == nil {
		return nil
	}
	return g.groups.Close()
}

// run runs the pipeline schedule (scheduleOf) over micros micro-batches
// (already in xs and ys), each micro-batch's loss weighted by dloss, and
// returns the sum of the first count of their losses on the last stage's
// TP rank 0 (0 elsewhere: that rank speaks for its replica); the rest are
// evaluation's padding (see gridEvaluate).
func (g *gridRank) run(ctx context.Context, micros, count int, dloss float32) (float64, error) {
	sched, err := scheduleOf(g.groups.Grid.PP, micros, g.chunks)
	if err != nil {
		return 0, fmt.Errorf("train: %w", err)
	}
	var pp *comm.Communicator
	if g.groups.Grid.PP > 1 {
		pp = g.groups.PP
	}
	g.stage.ZeroGrad()
	g.stage.DLoss = dloss
	if err := pipeline.Run(ctx, sched, g.stage, pp); err != nil {
		return 0, err
	}
	if !g.speaks() {
		return 0, nil
	}
	var sum float64
	for _, l := range g.stage.Losses()[:count] {
		sum += float64(l)
	}
	return sum, nil
}

// scheduleOf is the schedule the trainer runs for pp stages, micros
// micro-batches and chunks model chunks per rank: Megatron-LM's
// interleaved 1F1B with chunks > 1, else 1F1B.
func scheduleOf(pp, micros, chunks int) (pipeline.Schedule, error) {
	if chunks > 1 {
		return pipeline.New(pipeline.Interleaved, pp, micros, chunks)
	}
	return pipeline.New(pipeline.OneFOneB, pp, micros, 1)
}

// evalMicros is the micro-batches a schedule over k validation batches
// runs: k, rounded up to a multiple of pp under the interleaved schedule,
// which needs one (the padding repeats the last batch, its loss unused).
func evalMicros(k, pp, chunks int) int {
	if chunks > 1 {
		return (k + pp - 1) / pp * pp
	}
	return k
}

// speaks reports whether this rank reports its replica's loss: the last
// stage's TP rank 0 (every TP rank of it computes the same loss).
func (g *gridRank) speaks() bool { return g.groups.IsLastStage() && g.groups.Coord.TP == 0 }

// gridStep is trainStep under tensor and pipeline parallelism: the step's
// micro-batches through the pipeline schedule, the LayerNorm and tied
// embedding gradients completed, the loss of the replicas averaged (with
// the preemption flag), then the distributed optimizer's step, which a
// loss that is not finite replaces by dropping the gradients.
func (t *Trainer) gridStep() (o stepOutcome, err error) {
	g, accum := t.grid, t.spec.Batch.GradAccum
	g.buffers(accum, t.spec.Batch.MicroBatch*t.spec.Batch.Seq)
	for i := range accum {
		if err := t.sampler.Next(g.xs[i], g.ys[i]); err != nil {
			return o, err
		}
	}
	ctx := t.ctx()
	sum, err := g.run(ctx, accum, accum, float32(g.opt.LossScale())/float32(accum))
	if err != nil {
		return o, err
	}
	loss := float32(sum / float64(accum))
	if err := g.stage.ReduceNorms(ctx); err != nil {
		return o, err
	}
	if err := g.stage.ReduceTied(ctx, g.groups.Embed); err != nil {
		return o, err
	}
	if o.loss, o.stop, err = t.gridLoss(loss, preempted(t.env.Preempt)); err != nil {
		return o, err
	}
	o.lr = t.spec.Optim.LRAt(t.step)
	if finite(float64(o.loss)) {
		o.res, err = g.opt.Step(ctx, o.lr)
	} else {
		o.res = g.opt.Overflow()
	}
	if err != nil {
		return o, err
	}
	if !o.diverged() {
		t.step++
	}
	return o, nil
}

// gridLoss gives every rank the mean of the replicas' losses (each known
// to one rank, which passes it as loss; the others pass 0), whether any
// rank was preempted and whether any rank's asynchronous checkpoint write
// still runs (saveBusy), in one all-reduce over the world.
func (t *Trainer) gridLoss(loss float32, stop bool) (float32, bool, error) {
	v := []float32{loss, 0, t.saveBusy()}
	if stop {
		v[1] = 1
	}
	if err := t.env.Comm.AllReduce(t.ctx(), comm.F32(v), comm.Sum); err != nil {
		return 0, false, fmt.Errorf("train: all-reduce of the loss: %w", err)
	}
	t.noteSaves(v[2])
	return v[0] / float32(t.spec.Parallel.DP), v[1] > 0, nil
}

// evalChunk is the most validation batches one schedule runs, which
// bounds the batches held in memory whatever eval.batches says.
var evalChunk = 64 // a variable for tests

// gridEvaluate is Evaluate through the pipeline: the validation batches
// as the micro-batches of schedules whose loss gradient is 0 (so the
// backward passes leave the gradients 0, and the stage's activations are
// released as in training), padded to a multiple of pp under the
// interleaved schedule (evalMicros). Every replica evaluates the same
// batches, so DP replica 0's loss is the result.
func (t *Trainer) gridEvaluate() (float32, error) {
	g, n := t.grid, t.eval.Len()
	var sum float64
	for start := 0; start < n; start += evalChunk {
		k := min(evalChunk, n-start)
		micros := evalMicros(k, g.groups.Grid.PP, g.chunks)
		g.buffers(micros, t.spec.Batch.MicroBatch*t.spec.Batch.Seq)
		for i := range micros {
			if err := t.eval.Batch(start+min(i, k-1), g.xs[i], g.ys[i]); err != nil {
				return 0, err
			}
		}
		s, err := g.run(t.ctx(), micros, k, 0)
		g.stage.ZeroGrad()
		if err != nil {
			return 0, err
		}
		sum += s
	}
	loss := float32(sum / float64(n))
	if g.groups.Coord.DP != 0 || !g.speaks() {
		loss = 0
	}
	v := []float32{loss}
	if err := t.env.Comm.AllReduce(t.ctx(), comm.F32(v), comm.Sum); err != nil {
		return 0, fmt.Errorf("train: all-reduce of the validation loss: %w", err)
	}
	return v[0], nil
}

// nonFinite counts the values of the stage's parameters and optimizer
// state (the fp32 masters of mixed precision included) that are NaN or
// infinite. The parameters count apart from the masters because fp16
// overflows where fp32 does not.
func (g *gridRank) nonFinite() int {
	n := 0
	opt := g.opt.Optimizer()
	for _, s := range [][]float32{g.stage.Params, g.opt.Masters(), opt.M, opt.V} {
		for _, v := range s {
			if f := float64(v); f != f || math.IsInf(f, 0) {
				n++
			}
		}
	}
	return n
}

// memory is what the rank holds: its parts of the parameters and their
// gradients (float32 in every precision: bf16/fp16 parameters are float32
// values rounded to the type), the Adam moments it owns and, in mixed
// precision, their fp32 master weights, and the 16-bit buffer gradients
// travel in when parallel.grad_dtype is the precision, and the
// activations its stage holds (model.Stage.ActivationBytes).
func (g *gridRank) memory() MemoryUse {
	u := MemoryUse{Params: 4 * int64(len(g.stage.Params)), Grads: 4 * int64(len(g.stage.Grads)), Optimizer: g.opt.OptimizerBytes()}
	u.Buffers = g.opt.BufferBytes()
	u.Activations = g.stage.ActivationBytes()
	u.Total = u.Params + u.Grads + u.Optimizer + u.Activations + u.Buffers
	return u
}

// describe names the layout for the first log line.
func (g *gridRank) describe(p Parallel, precision string) string {
	sp := ""
	if p.SP() {
		sp = ", sequence parallel"
	}
	sched := "1F1B, layers"
	if g.chunks > 1 {
		sched = fmt.Sprintf("interleaved 1F1B, %d chunks per rank, layers per virtual stage", g.chunks)
	}
	return fmt.Sprintf("tp %d, pp %d (%s %v), dp %d%s, ZeRO stage %d, %s", p.TP, p.PP, sched, g.split, p.DP, sp, p.ZeroStage, precision)
}
