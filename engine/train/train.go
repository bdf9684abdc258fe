package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/zero"
	"github.com/gtrain/gtrain/planner"
)

// Env is what a rank's trainer knows of its surroundings.
type Env struct {
	Rank, World int
	// Host is the rank's host as the hostfile names it (gtrain run's
	// GTRAIN_HOST), for errors; "" for the system's host name.
	Host string
	// Comm connects the data-parallel ranks (rank and size as above); nil
	// for a single rank.
	Comm       *comm.Communicator
	LocalWorld int       // ranks on this host, to share its cores (0 means 1)
	CPUs       int       // the CPUs gtrain run --bind gave this rank (GTRAIN_CPUS); 0: unbound
	Status     io.Writer // JSON status records, one per line; nil for none
	Log        io.Writer // human-readable progress lines; nil for none
	Warn       func(string)
	// Resume continues from the newest valid checkpoint in the spec's
	// checkpoint directory; without it, a directory that already holds
	// checkpoints is an error rather than something to overwrite.
	Resume bool
	// ResumeFrom is a step directory to resume from instead of the newest
	// (implies Resume); newer step directories are set aside (ckpt.SetAside).
	ResumeFrom string
	// Restart: this rank belongs to a restart of the same job. It resumes
	// from the newest valid checkpoint if there is one, else starts afresh.
	Restart bool
	// RunID is the job's id, recorded as the owner of the writer lock.
	RunID string
	// StopAfter ends the run after this many steps in total, as an
	// interruption would (tests of resume); 0 runs the spec's steps.
	StopAfter int
	// Preempt is closed when the rank is asked to stop for preemption
	// (SIGTERM or SIGUSR1, forwarded by the agent). While the trainer is
	// being built, it gives up promptly and saves nothing; while training,
	// it finishes the current step, saves a checkpoint (when
	// checkpoint.dir is set) and Run returns with Result.Preempted. Ranks
	// agree on the step at which to stop even when the signal reaches them
	// at different times. Nil: never.
	Preempt <-chan struct{}
}

// Result is how a run ended.
type Result struct {
	Steps      int       // steps completed in total
	Losses     []float32 // training loss of each step this run took
	ValLoss    float32   // last validation loss (0 when never evaluated)
	Checkpoint string    // the last checkpoint written, if any
	Resumed    int       // the step the run resumed from (0 for a fresh run)
	Skipped    int       // steps skipped for fp16 overflow, in the whole run
	// Preempted: the run stopped early because Env.Preempt was closed (a
	// nil error). Checkpoint is the one saved at the stop, if any; none is
	// saved when the trainer was still being built.
	Preempted bool
}

// Trainer holds one rank's model, its data-parallel state (parameters,
// gradients and optimizer, see engine/zero) and its data.
type Trainer struct {
	spec    Spec
	env     Env
	model   *model.Model
	zero    *zero.Engine
	grid    *gridRank // tensor and pipeline parallelism (tp·pp > 1): instead of model and zero
	sampler *data.Sampler
	train   *data.Tokens
	val     *data.Tokens
	eval    *data.EvalSet // nil without validation data or eval.every
	x, y    []int32
	step    int             // steps completed
	runCtx  context.Context // Run's, for the collectives of checkpoints
	saved   string          // the newest checkpoint this run saved or resumed from
	async   *asyncSave      // checkpoint.async: the snapshot and the write in flight (async.go)
	metrics *metricsLog     // rank 0's metrics.jsonl (metrics.go); nil elsewhere
	// commWait is comm.BlockedTime at the start of the step in progress.
	commWait time.Duration
}

// ctx is the context of the run in progress.
func (t *Trainer) ctx() context.Context { return t.runCtx }

// NewContext builds a trainer from a spec (model initialised from the
// seed, optimizer state zero, sampler at its start); it gives up when ctx ends (with its cause) or
// env.Preempt is closed (with ErrPreempted), asked between the steps that
// allocate and initialise. It refuses with a *MemoryError, before
// allocating anything, a job that does not fit in this host's memory.
func NewContext(ctx context.Context, spec Spec, env Env) (*Trainer, error) {
	spec, err := spec.Resolved()
	if err != nil {
		return nil, err
	}
	if env.World = max(env.World, 1); env.World > 1 && (env.Comm == nil || env.Comm.Size() != env.World) {
		return nil, fmt.Errorf("train: %d ranks need a communicator of that size", env.World)
	}
	if env.Warn == nil {
		env.Warn = func(string) {}
	}
	env.Resume = env.Resume || env.ResumeFrom != ""
	// Before anything the spec decides (the layout fitDP refits, the
	// memory check's collective): ranks of different jobs stop here.
	if err := checkSameSpec(ctx, spec, env); err != nil {
		return nil, err
	}
	if spec, err = fitDP(spec, env); err != nil {
		return nil, err
	}
	cfg := spec.Model.Config
	t := &Trainer{spec: spec, env: env}
	if err := t.checkMemory(ctx); err != nil {
		return nil, err
	}
	stop := func() error { return t.interrupted(ctx, "generate or open the data") }
	if t.train, t.val, err = openData(spec, cfg.Vocab, stop); err != nil {
		return nil, err
	}
	if err := t.build(ctx); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// build allocates the model, the data-parallel engine, the sampler and the
// batch buffers, giving up between steps (and between the tensors of the
// initialisation) when ctx ends or the rank is preempted.
func (t *Trainer) build(ctx context.Context) error {
	if t.spec.Parallel.ModelParallel() > 1 {
		return t.buildGrid(ctx)
	}
	spec, env, cfg := t.spec, t.env, t.spec.Model.Config
	B, T := spec.Batch.MicroBatch, spec.Batch.Seq
	rc, _ := model.ParseRecompute(spec.Recompute)
	zc, err := spec.ZeroConfig()
	if err != nil {
		return err
	}
	zc.Threads = spec.threads(env) // the engine's conversions and AdamW, as the model's kernels
	flat, err := t.initParams(ctx)
	if err != nil {
		return err
	}
	if t.zero, err = zero.New(zc, cfg, env.Comm, flat); err != nil {
		return err
	}
	if err := t.interrupted(ctx, "allocate activations"); err != nil {
		return err
	}
	if t.model, err = model.NewWithStore(cfg, B, T, spec.cpuBackend(env), rc, t.zero); err != nil {
		return err
	}
	// The rank layout gtrain plan prints: with TP = PP = 1 a rank's data
	// shard is its rank.
	return t.buildData(planner.Grid{TP: spec.Parallel.TP, PP: spec.Parallel.PP, DP: spec.Parallel.DP})
}

// buildData makes the sampler of this rank's data-parallel replica in
// grid (every TP and PP rank of a replica draws the same rows), the
// validation batches and the batch buffers.
func (t *Trainer) buildData(grid planner.Grid) error {
	spec, env := t.spec, t.env
	B, T := spec.Batch.MicroBatch, spec.Batch.Seq
	var err error
	t.sampler, err = data.NewSampler(t.train, data.SamplerConfig{Seed: spec.Seed, Batch: B, Seq: T, Rank: grid.Coord(env.Rank).DP, World: grid.DP})
	if err != nil {
		return err
	}
	if t.val != nil && spec.Eval.Every > 0 {
		if t.eval, err = data.EvalBatches(t.val, B, T, spec.Eval.Batches); err != nil {
			return err
		}
	}
	t.x, t.y = make([]int32, B*T), make([]int32, B*T)
	return nil
}

// threads is the compute goroutines for one rank: the spec's, or the
// CPUs it is bound to, or this host's cores shared among its ranks.
func (s Spec) threads(env Env) int {
	if s.Threads > 0 {
		return s.Threads
	}
	if env.CPUs > 0 {
		return min(env.CPUs, MaxThreads)
	}
	return max(1, runtime.NumCPU()/max(1, env.LocalWorld))
}

// openData opens the token files, or builds the synthetic corpus, and
// checks every token against the vocabulary once. It gives up when stop
// says so, asked before it starts and between chunks of the corpus.
func openData(spec Spec, vocab int, stop func() error) (train, val *data.Tokens, err error) {
	if err := stop(); err != nil {
		return nil, nil, err
	}
	if spec.Data.Train == "" {
		tr, err := synthetic(spec.Seed, spec.Data.Synthetic, stop)
		if err != nil {
			return nil, nil, err
		}
		v, err := synthetic(spec.Seed+1, max(spec.Data.Synthetic/10, spec.Batch.Seq+2), stop)
		if err != nil {
			return nil, nil, err
		}
		train, val = data.NewTokens(tr), data.NewTokens(v)
	} else {
		if err := data.CheckModelVocab(spec.Data.Train, vocab); err != nil {
			return nil, nil, err
		}
		if train, err = data.Open(spec.Data.Train); err != nil {
			return nil, nil, err
		}
		if spec.Data.Val != "" {
			if val, err = data.Open(spec.Data.Val); err != nil {
				train.Close()
				return nil, nil, err
			}
		}
	}
	for _, tk := range []*data.Tokens{train, val} {
		if tk == nil {
			continue
		}
		if err := tk.CheckVocab(vocab); err != nil {
			train.Close()
			if val != nil {
				val.Close()
			}
			return nil, nil, err
		}
	}
	return train, val, nil
}

// synthetic is data.Synthetic(seed, n), generated a chunk at a time so
// that stop can end a long generation.
func synthetic(seed uint64, n int, stop func() error) ([]uint16, error) {
	out := make([]uint16, 0, n)
	err := data.SyntheticStream(seed, int64(n), func(chunk []uint16) error {
		out = append(out, chunk...)
		return stop()
	})
	return out, err
}

// Close releases the data files and the process groups.
func (t *Trainer) Close() error {
	err := t.train.Close()
	if gerr := t.grid.close(); err == nil {
		err = gerr
	}
	if t.val != nil {
		if verr := t.val.Close(); err == nil {
			err = verr
		}
	}
	return err
}

// stepOutcome is what one optimizer step produced.
type stepOutcome struct {
	loss float32 // mean over the ranks
	res  zero.StepResult
	lr   float64
	stop bool // some rank was preempted: the job stops after this step
}

// diverged says that the step produced a value that is not finite and that
// fp16 loss scaling could not absorb: training cannot go on.
func (o stepOutcome) diverged() bool { return o.res.NonFinite && !o.res.Skipped }

// trainStep is one optimizer step: the micro-batches of this rank's share
// of the global batch forward and backward (gradients reduced over the
// ranks as backward goes), the mean loss over the ranks, then the engine's
// update, which a loss that is not finite replaces by an overflow (no
// update). A step that diverged leaves t.step where it was.
func (t *Trainer) trainStep() (o stepOutcome, err error) {
	if t.grid != nil {
		return t.gridStep()
	}
	m, e, accum := t.model, t.zero, t.spec.Batch.GradAccum
	dloss := float32(e.LossScale()) / float32(accum)
	var sum float64
	for i := range accum {
		e.BeginMicro(i, accum)
		if err := t.sampler.Next(t.x, t.y); err != nil {
			return o, err
		}
		l, err := m.Forward(t.x, t.y)
		if err != nil {
			return o, err
		}
		sum += float64(l)
		m.Backward(dloss)
	}
	if o.loss, o.stop, err = t.meanLoss(float32(sum / float64(accum))); err != nil {
		return o, err
	}
	o.lr = t.spec.Optim.LRAt(t.step)
	if finite(float64(o.loss)) {
		o.res, err = e.Step(o.lr)
	} else {
		o.res, err = e.Overflow()
	}
	if err != nil {
		return o, err
	}
	if !o.diverged() {
		t.step++
	}
	return o, nil
}

// meanLoss averages the loss over the ranks and, in the same all-reduce,
// whether any rank has been preempted: the average of 0s and 1s is above
// 0 on every rank as soon as one rank says 1, so all ranks stop after the
// same step at the cost of no extra collective. The same goes for whether
// any rank's asynchronous checkpoint write still runs (saveBusy). The
// gradient reductions still in flight finish first (the update needs them
// anyway).
func (t *Trainer) meanLoss(loss float32) (float32, bool, error) {
	v := []float32{loss, 0, t.saveBusy()}
	if preempted(t.env.Preempt) {
		v[1] = 1
	}
	if err := t.zero.Err(); err != nil {
		return 0, false, err
	}
	if err := t.zero.Mean(v); err != nil {
		return 0, false, err
	}
	t.noteSaves(v[2])
	return v[0], v[1] > 0, nil
}

// Run trains until the spec's steps (or env.StopAfter) are done, ctx ends
// or the rank is preempted, checkpointing as the spec says.
func Run(ctx context.Context, spec Spec, env Env) (Result, error) {
	t, err := NewContext(ctx, spec, env)
	if errors.Is(err, ErrPreempted) {
		return Result{Preempted: true}, nil
	}
	if err != nil {
		return Result{}, err
	}
	defer t.Close()
	return t.Run(ctx)
}

// Run is the training loop of t.
func (t *Trainer) Run(ctx context.Context) (Result, error) {
	var res Result
	t.runCtx = ctx
	if t.zero != nil {
		t.zero.Bind(ctx)
	}
	release, err := t.prepareCheckpoints(&res)
	if err != nil {
		return res, err
	}
	defer release()
	if err := t.openMetrics(); err != nil {
		return res, err
	}
	defer t.closeMetrics()
	if res.Resumed > 0 {
		t.saved = filepath.Join(t.spec.Checkpoint.Dir, ckpt.StepDirName(int64(res.Resumed)))
	}
	last := t.spec.Steps
	if t.env.StopAfter > 0 {
		last = min(last, t.env.StopAfter)
	}
	tokens := t.spec.Batch.MicroBatch * t.spec.Batch.Seq * t.spec.Batch.GradAccum * t.spec.Parallel.DP
	t.logf("gtrain engine: %s, %d parameters, %d steps of %d tokens, %s, %d threads per rank, starting at step %d",
		t.describeModel(), t.spec.Model.Config.NumParams(), t.spec.Steps, tokens, t.describeLayout(), t.spec.threads(t.env), t.step)
	for t.step < last && !res.Preempted {
		if ctx.Err() != nil {
			return res, fmt.Errorf("train: stopped at step %d: %w", t.step, context.Cause(ctx))
		}
		if testHookStep != nil {
			testHookStep(t)
		}
		if err := t.runStep(&res, tokens); err != nil {
			res.Steps, res.Skipped = t.step, t.skipped()
			return res, err
		}
	}
	res.Steps, res.Skipped = t.step, t.skipped()
	// An asynchronous checkpoint still being written is completed before
	// the run ends: the job must not exit before it is durable.
	dir, err := t.finishSaves()
	if dir != "" {
		res.Checkpoint = dir
	}
	return res, err
}

// runStep takes one step and does what follows it: the status record,
// evaluation, a checkpoint when one is due or the job is preempted. A
// step whose numbers are not finite ends the run with a *DivergedError,
// after its record, and saves nothing.
func (t *Trainer) runStep(res *Result, tokens int) error {
	start := time.Now()
	t.commWait = blockedTime()
	o, err := t.trainStep()
	if err != nil {
		return fmt.Errorf("train: step %d: %w", t.step+1, err)
	}
	rec := t.record(t.step, o, time.Since(start), tokens)
	if o.diverged() {
		rec.Step = t.step + 1
		t.report(rec)
		return t.diverged(rec)
	}
	res.Losses = append(res.Losses, o.loss)
	if t.eval != nil && (t.step%t.spec.Eval.Every == 0 || t.step == t.spec.Steps) {
		if res.ValLoss, err = t.Evaluate(); err != nil {
			return err
		}
		rec.ValLoss = &res.ValLoss
	}
	t.report(rec)
	if rec.ValLoss != nil && !finite(float64(*rec.ValLoss)) {
		return t.diverged(rec)
	}
	if err := t.checkpointAfter(res, o.stop); err != nil {
		return err
	}
	if o.stop {
		res.Preempted = true
		t.logPreempted(res.Checkpoint)
	}
	return nil
}

// Evaluate is the mean loss over the validation batches, over all ranks
// (every rank evaluates the same batches; stage 3 needs all of them to
// gather the layers).
func (t *Trainer) Evaluate() (float32, error) {
	if t.grid != nil {
		return t.gridEvaluate()
	}
	var sum float64
	for i := range t.eval.Len() {
		if err := t.eval.Batch(i, t.x, t.y); err != nil {
			return 0, err
		}
		l, err := t.model.Forward(t.x, t.y)
		if err != nil {
			return 0, err
		}
		sum += float64(l)
	}
	if err := t.zero.Err(); err != nil {
		return 0, err
	}
	return float32(sum / float64(t.eval.Len())), nil
}

func (t *Trainer) describeModel() string {
	c := t.spec.Model.Config
	return fmt.Sprintf("GPT-2 %d layers, %d heads, %d hidden, seq %d, vocab %d", c.Layers, c.Heads, c.Embd, t.spec.Batch.Seq, c.Vocab)
}

// describeLayout names the data-parallel setup.
func (t *Trainer) describeLayout() string {
	p := t.spec.Parallel
	if t.grid != nil {
		return t.grid.describe(p, t.spec.Precision)
	}
	return fmt.Sprintf("dp %d, ZeRO stage %d, %s", p.DP, p.ZeroStage, t.spec.Precision)
}

// skipped is the steps skipped for fp16 overflow (none without fp16).
func (t *Trainer) skipped() int {
	if s := t.scaler(); s != nil {
		return s.Scaler().Skipped
	}
	return 0
}

// logf writes a progress line; only rank 0 speaks for the job.
func (t *Trainer) logf(format string, a ...any) {
	if t.env.Log != nil && t.env.Rank == 0 {
		fmt.Fprintf(t.env.Log, format+"\n", a...)
	}
}

// marshalSpec is the resolved spec as checkpoints record it.
func (t *Trainer) marshalSpec() json.RawMessage {
	b, _ := json.Marshal(t.spec)
	return b
}

// initParams is the full model initialised from the job's seed, as every
// rank computes it and then keeps its own part: the same values on every
// rank, no broadcast needed. It gives up, between tensors, when ctx ends
// or the rank is preempted.
func (t *Trainer) initParams(ctx context.Context) ([]float32, error) {
	flat := make([]float32, t.spec.Model.Config.NumParams())
	var stopped error
	model.InitParamsUntil(t.spec.Model.Config, t.spec.Seed, flat, func() bool {
		stopped = t.interrupted(ctx, "initialise parameters")
		return stopped != nil
	})
	return flat, stopped
}
