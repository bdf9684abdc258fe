package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// Env is what a rank's trainer knows of its surroundings.
type Env struct {
	Rank, World int
	LocalWorld  int       // ranks on this host, to share its cores (0 means 1)
	Status      io.Writer // JSON status records, one per line; nil for none
	Log         io.Writer // human-readable progress lines; nil for none
	Warn        func(string)
	// Resume continues from the newest valid checkpoint in the spec's
	// checkpoint directory; without it, a directory that already holds
	// checkpoints is an error rather than something to overwrite.
	Resume bool
	// StopAfter ends the run after this many steps in total, as an
	// interruption would (tests of resume); 0 runs the spec's steps.
	StopAfter int
}

// Result is how a run ended.
type Result struct {
	Steps      int       // steps completed in total
	Losses     []float32 // training loss of each step this run took
	ValLoss    float32   // last validation loss (0 when never evaluated)
	Checkpoint string    // the last checkpoint written, if any
	Resumed    int       // the step the run resumed from (0 for a fresh run)
}

// Trainer holds one rank's model, optimizer and data.
type Trainer struct {
	spec    Spec
	env     Env
	model   *model.Model
	opt     *optim.AdamW
	sampler *data.Sampler
	train   *data.Tokens
	val     *data.Tokens
	eval    *data.EvalSet // nil without validation data or eval.every
	x, y    []int32
	step    int // steps completed
}

// New builds a trainer from a spec: model initialised from the seed,
// optimizer state zero, sampler at its start.
func New(spec Spec, env Env) (*Trainer, error) {
	spec, err := spec.Resolved()
	if err != nil {
		return nil, err
	}
	if env.World > 1 {
		return nil, fmt.Errorf("train: %d ranks: this engine trains on one rank; data parallelism arrives with issue 6 (run with --nproc-per-node 1)", env.World)
	}
	if env.Warn == nil {
		env.Warn = func(string) {}
	}
	cfg := spec.Model.Config
	t := &Trainer{spec: spec, env: env}
	if t.train, t.val, err = openData(spec, cfg.Vocab); err != nil {
		return nil, err
	}
	if err := t.build(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// build allocates the model, optimizer, sampler and batch buffers.
func (t *Trainer) build() error {
	spec, env, cfg := t.spec, t.env, t.spec.Model.Config
	var err error
	B, T := spec.Batch.MicroBatch, spec.Batch.Seq
	rc, _ := model.ParseRecompute(spec.Recompute)
	if t.model, err = model.New(cfg, B, T, backend.CPU{Threads: spec.threads(env)}, rc); err != nil {
		return err
	}
	t.model.Init(spec.Seed)
	t.opt = optim.NewAdamW(spec.Optim, len(t.model.Params), groups(t.model.ParamList()))
	t.sampler, err = data.NewSampler(t.train, data.SamplerConfig{Seed: spec.Seed, Batch: B, Seq: T, Rank: env.Rank, World: max(env.World, 1)})
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

// threads is the compute goroutines for one rank: the spec's, or this
// host's cores shared among its ranks.
func (s Spec) threads(env Env) int {
	if s.Threads > 0 {
		return s.Threads
	}
	return max(1, runtime.NumCPU()/max(1, env.LocalWorld))
}

// groups merges consecutive parameters with the same weight-decay setting.
func groups(ps []model.Param) []optim.Group {
	var gs []optim.Group
	for _, p := range ps {
		if n := len(gs); n > 0 && gs[n-1].Decay == p.Decay && gs[n-1].Offset+gs[n-1].Size == p.Offset {
			gs[n-1].Size += p.Size()
			continue
		}
		gs = append(gs, optim.Group{Offset: p.Offset, Size: p.Size(), Decay: p.Decay})
	}
	return gs
}

// openData opens the token files, or builds the synthetic corpus, and
// checks every token against the vocabulary once.
func openData(spec Spec, vocab int) (train, val *data.Tokens, err error) {
	if spec.Data.Train == "" {
		train = data.NewTokens(data.Synthetic(spec.Seed, spec.Data.Synthetic))
		val = data.NewTokens(data.Synthetic(spec.Seed+1, max(spec.Data.Synthetic/10, spec.Batch.Seq+2)))
	} else {
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

// Close releases the data files.
func (t *Trainer) Close() error {
	err := t.train.Close()
	if t.val != nil {
		if verr := t.val.Close(); err == nil {
			err = verr
		}
	}
	return err
}

// Step is one optimizer step: the micro-batches of one global batch forward
// and backward, the gradient clipped, AdamW applied. It returns the mean
// loss, the gradient norm before clipping and the learning rate used.
func (t *Trainer) Step() (loss float32, norm, lr float64, err error) {
	m, accum := t.model, t.spec.Batch.GradAccum
	m.ZeroGrad()
	var sum float64
	for range accum {
		if err := t.sampler.Next(t.x, t.y); err != nil {
			return 0, 0, 0, err
		}
		l, err := m.Forward(t.x, t.y)
		if err != nil {
			return 0, 0, 0, err
		}
		sum += float64(l)
		m.Backward(1 / float32(accum))
	}
	norm = optim.GradNorm(m.Grads)
	optim.Clip(m.Grads, norm, t.spec.Optim.GradClip)
	lr = t.spec.Optim.LRAt(t.step)
	t.opt.Update(m.Params, m.Grads, lr)
	t.step++
	return float32(sum / float64(accum)), norm, lr, nil
}

// Run trains until the spec's steps (or env.StopAfter) are done or ctx ends,
// checkpointing as the spec says.
func Run(ctx context.Context, spec Spec, env Env) (Result, error) {
	t, err := New(spec, env)
	if err != nil {
		return Result{}, err
	}
	defer t.Close()
	return t.Run(ctx)
}

// Run is the training loop of t.
func (t *Trainer) Run(ctx context.Context) (Result, error) {
	var res Result
	if err := t.prepareCheckpoints(&res); err != nil {
		return res, err
	}
	last := t.spec.Steps
	if t.env.StopAfter > 0 {
		last = min(last, t.env.StopAfter)
	}
	tokens := t.spec.Batch.MicroBatch * t.spec.Batch.Seq * t.spec.Batch.GradAccum * max(t.env.World, 1)
	t.logf("gtrain engine: %s, %d parameters, %d steps of %d tokens, %d threads, starting at step %d",
		t.describeModel(), len(t.model.Params), t.spec.Steps, tokens, t.spec.threads(t.env), t.step)
	for t.step < last {
		if ctx.Err() != nil {
			return res, fmt.Errorf("train: stopped at step %d: %w", t.step, context.Cause(ctx))
		}
		start := time.Now()
		loss, norm, lr, err := t.Step()
		if err != nil {
			return res, fmt.Errorf("train: step %d: %w", t.step+1, err)
		}
		elapsed := time.Since(start)
		res.Losses = append(res.Losses, loss)
		rec := t.record(loss, norm, lr, elapsed, tokens)
		if t.eval != nil && (t.step%t.spec.Eval.Every == 0 || t.step == t.spec.Steps) {
			if res.ValLoss, err = t.Evaluate(); err != nil {
				return res, err
			}
			rec.ValLoss = &res.ValLoss
		}
		t.report(rec)
		if t.checkpointDue() {
			if res.Checkpoint, err = t.SaveCheckpoint(); err != nil {
				return res, err
			}
		}
	}
	res.Steps = t.step
	return res, nil
}

// Evaluate is the mean loss over the validation batches.
func (t *Trainer) Evaluate() (float32, error) {
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
	return float32(sum / float64(t.eval.Len())), nil
}

func (t *Trainer) describeModel() string {
	c := t.model.Config
	return fmt.Sprintf("GPT-2 %d layers, %d heads, %d hidden, seq %d, vocab %d", c.Layers, c.Heads, c.Embd, t.spec.Batch.Seq, c.Vocab)
}

func (t *Trainer) logf(format string, a ...any) {
	if t.env.Log != nil {
		fmt.Fprintf(t.env.Log, format+"\n", a...)
	}
}

// marshalSpec is the resolved spec as checkpoints record it.
func (t *Trainer) marshalSpec() json.RawMessage {
	b, _ := json.Marshal(t.spec)
	return b
}
