// Package train is the engine's training loop: it builds the model, the
// optimizer and the data sampler from a job Spec, runs the steps, reports a
// status record per step, and writes and resumes checkpoints.
package train

import (
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
	"github.com/gtrain/gtrain/engine/zero"
)

// Spec is a training job: what a job file says. The launcher fills it from
// YAML (viper, mapstructure tags) and hands it to every rank as JSON.
type Spec struct {
	Model      ModelSpec    `json:"model" mapstructure:"model"`
	Data       DataSpec     `json:"data" mapstructure:"data"`
	Batch      BatchSpec    `json:"batch" mapstructure:"batch"`
	Optim      optim.Config `json:"optim" mapstructure:"optim"`
	Steps      int          `json:"steps" mapstructure:"steps"`
	Seed       uint64       `json:"seed" mapstructure:"seed"`
	Recompute  string       `json:"recompute" mapstructure:"recompute"` // none, selective or full
	Checkpoint CkptSpec     `json:"checkpoint" mapstructure:"checkpoint"`
	Eval       EvalSpec     `json:"eval" mapstructure:"eval"`
	LogEvery   int          `json:"log_every" mapstructure:"log_every"` // a log line every N steps (status records every step)
	Parallel   Parallel     `json:"parallel" mapstructure:"parallel"`
	Threads    int          `json:"threads" mapstructure:"threads"` // compute goroutines per rank; 0: this host's cores / its ranks
	// Precision is the working parameters' type: fp32, or bf16 or fp16
	// (mixed precision: fp32 master weights and optimizer state).
	Precision string            `json:"precision" mapstructure:"precision"`
	LossScale zero.ScalerConfig `json:"loss_scale" mapstructure:"loss_scale"` // fp16 only
	Log       LogSpec           `json:"log,omitzero" mapstructure:"log"`
}

// LogSpec says where else a run's metrics go, besides metrics.jsonl in its
// run directory.
type LogSpec struct {
	// TensorBoard is a directory for TensorBoard event files (scalars per
	// step, the job as text), relative to the job's directory as
	// checkpoint.dir is; rank 0 writes them. Empty: none.
	TensorBoard string `json:"tensorboard,omitempty" mapstructure:"tensorboard"`
}

// ModelSpec names a preset and overrides any of its fields (0 keeps the
// preset's value).
type ModelSpec struct {
	Preset       string `json:"preset" mapstructure:"preset"`
	model.Config `mapstructure:",squash"`
}

// DataSpec says where tokens come from: nanoGPT .bin files, or the built-in
// synthetic corpus when Train is empty.
type DataSpec struct {
	Train     string `json:"train,omitempty" mapstructure:"train"`
	Val       string `json:"val,omitempty" mapstructure:"val"`
	Synthetic int    `json:"synthetic,omitempty" mapstructure:"synthetic"` // tokens of synthetic corpus (train; val gets a tenth)
}

// BatchSpec is the batch geometry. The global batch is MicroBatch × Seq
// tokens × GradAccum micro-steps × data-parallel ranks.
type BatchSpec struct {
	MicroBatch int `json:"micro_batch" mapstructure:"micro_batch"`
	Seq        int `json:"seq" mapstructure:"seq"` // tokens per sequence; 0 means the model's seq
	GradAccum  int `json:"grad_accum" mapstructure:"grad_accum"`
}

// CkptSpec is the checkpoint policy. An empty Dir disables checkpoints.
type CkptSpec struct {
	Dir   string `json:"dir" mapstructure:"dir"`
	Every int    `json:"every" mapstructure:"every"` // steps between checkpoints; one is always written at the end
	Keep  int    `json:"keep" mapstructure:"keep"`   // newest checkpoints kept; 0 keeps all
	// Async writes checkpoints in the background: at the step boundary
	// each rank copies what it saves into host memory (one copy of its
	// saved state, kept from one checkpoint to the next) and trains on
	// while a goroutine writes it; the final and the preemption checkpoint
	// are written at once, as without it. Omitted when false, so that the
	// job of a checkpoint written without it reads as before.
	Async bool `json:"async,omitempty" mapstructure:"async"`
}

// EvalSpec is the validation-loss policy; Every 0 disables it.
type EvalSpec struct {
	Every   int `json:"every" mapstructure:"every"`
	Batches int `json:"batches" mapstructure:"batches"`
}

// Parallel is the layout: the tensor-, pipeline- and data-parallel degrees
// (a run has tp × pp × dp ranks, laid out as `gtrain plan` prints them, TP
// fastest), the ZeRO stage, and how gradients travel. With tp = pp = 1 the
// engine runs data parallelism and ZeRO 0–3 in any precision; with tp·pp >
// 1, Megatron-LM's tensor and pipeline parallelism (1F1B over grad_accum
// micro-batches, or its interleaved schedule with virtual_stages > 1) with
// ZeRO 0 or 1, in any precision (bf16/fp16 as fp32
// values rounded to the type, with fp32 masters: zero.DistConfig).
type Parallel struct {
	DP        int `json:"dp" mapstructure:"dp"` // data-parallel replicas; 0 means every rank of the run over tp × pp
	TP        int `json:"tp" mapstructure:"tp"`
	PP        int `json:"pp" mapstructure:"pp"`
	ZeroStage int `json:"zero_stage" mapstructure:"zero_stage"`
	// SequenceParallel shards the activations outside the tensor-parallel
	// regions along the sequence (Korthikanti et al. 2022). Unset: on when
	// tp > 1, as gtrain plan counts the activations.
	SequenceParallel *bool `json:"sequence_parallel,omitempty" mapstructure:"sequence_parallel"`
	// PPLayers is the number of layers of each pipeline stage (one count
	// per stage, adding up to the model's layers; with VirtualStages v > 1,
	// one per virtual stage, pp × v counts); empty: the planner's split,
	// the later stages taking the extra layers.
	PPLayers []int `json:"pp_layers,omitempty" mapstructure:"pp_layers"`
	// VirtualStages is the model chunks per pipeline rank of Megatron-LM's
	// interleaved schedule (its virtual_pipeline_model_parallel_size): 0
	// or 1 runs 1F1B; v > 1 splits the model into pp × v virtual stages,
	// rank s holding stages s, s+pp, …, and needs pp ≥ 2 and grad_accum a
	// multiple of pp. Checkpoints do not depend on it.
	VirtualStages int `json:"virtual_stages,omitempty" mapstructure:"virtual_stages"`
	// BucketMB and FirstBucketMB size the gradient buckets (MiB of
	// gradients) reduced while backward goes on; the first to fill is
	// small so that communication starts early (PyTorch DDP's 25 and 1).
	BucketMB      float64 `json:"bucket_mb" mapstructure:"bucket_mb"`
	FirstBucketMB float64 `json:"first_bucket_mb" mapstructure:"first_bucket_mb"`
	// GradDType is the type gradients are accumulated and reduced in: the
	// precision's (default; half the bytes of fp32 under bf16 or fp16) or
	// fp32.
	GradDType string `json:"grad_dtype,omitempty" mapstructure:"grad_dtype"`
	// GradCompression compresses the data-parallel gradient all-reduce
	// (tp = pp = 1, ZeRO 0–1), with error feedback: none (default),
	// powersgd:RANK (PyTorch's powerSGD_hook) or int8 (blockwise, 256
	// values per scale). See engine/zero's compress.go.
	GradCompression string `json:"grad_compression,omitempty" mapstructure:"grad_compression"`
	// PowerSGDStartStep is PyTorch's start_powerSGD_iter: the optimizer
	// steps all-reduced whole before PowerSGD starts. Unset:
	// DefaultPowerSGDStartStep.
	PowerSGDStartStep *int `json:"powersgd_start_step,omitempty" mapstructure:"powersgd_start_step"`
}

// DefaultPowerSGDStartStep is parallel.powersgd_start_step when unset:
// PyTorch's 1000 is meant for runs of many thousand steps; the first
// steps, while Adam's moments and the loss move fastest, are the ones
// compression hurts most.
const DefaultPowerSGDStartStep = 10

// DefaultSpec is the embedded default job: a tiny GPT on the synthetic
// corpus, whose loss falls clearly within a minute on two cores.
func DefaultSpec() Spec {
	return Spec{
		Model: ModelSpec{Preset: "tiny"},
		Data:  DataSpec{Synthetic: 2_000_000},
		Batch: BatchSpec{MicroBatch: 16, GradAccum: 1},
		Optim: optim.Config{LR: 2e-3, MinLR: 2e-4, WarmupSteps: 20, Beta1: 0.9, Beta2: 0.95,
			Eps: 1e-8, WeightDecay: 0.1, GradClip: 1},
		Steps:      200,
		Seed:       1337,
		Recompute:  string(model.RecomputeNone),
		Checkpoint: CkptSpec{Every: 100, Keep: 2},
		Eval:       EvalSpec{Every: 50, Batches: 8},
		LogEvery:   10,
		Parallel:   Parallel{TP: 1, PP: 1, BucketMB: 25, FirstBucketMB: 1},
		Precision:  "fp32",
	}
}

// ModelConfig resolves the preset and its overrides.
func (s Spec) ModelConfig() (model.Config, error) {
	var c model.Config
	if s.Model.Preset != "" {
		p, err := model.Preset(s.Model.Preset)
		if err != nil {
			return c, err
		}
		c = p
	}
	o := s.Model.Config
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&c.Layers, o.Layers}, {&c.Heads, o.Heads}, {&c.Embd, o.Embd}, {&c.Seq, o.Seq}, {&c.Vocab, o.Vocab},
	} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
	return c, c.Validate()
}

// SeqLen is the training sequence length.
func (s Spec) SeqLen(c model.Config) int {
	if s.Batch.Seq > 0 {
		return s.Batch.Seq
	}
	return c.Seq
}

// Upper bounds of the counts of a spec beyond the model's shape (see
// model.MaxLayers). Each is far above what a run uses and keeps what is
// computed from it bounded: a typo must be an error naming its key, not an
// allocation or a loop without end.
const (
	MaxSteps      = 10_000_000 // a loss per step is kept in Result (GPT-3 took about 94k steps)
	MaxMicroBatch = 1 << 16    // sequences per rank per micro-step
	MaxGradAccum  = 1 << 16
	MaxSynthetic  = 1 << 32 // tokens of the synthetic corpus, generated in memory (8 GiB)
	MaxEvalBatch  = 1 << 16 // validation batches per evaluation
	MaxThreads    = 4096    // compute goroutines per rank
	MaxDP         = 1 << 20 // data-parallel ranks
	MaxBucketMB   = 1 << 20 // MiB per gradient bucket (1 TiB)
)

// Validate reports the first setting that cannot run, naming its key.
func (s Spec) Validate() error {
	c, err := s.ModelConfig()
	if err != nil {
		return fmt.Errorf("job: %w", err) // "model: …", naming the key
	}
	if err := s.validateFloats(); err != nil {
		return err
	}
	if err := s.Optim.Validate(); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if err := s.validateBounds(); err != nil {
		return err
	}
	if _, err := model.ParseRecompute(s.Recompute); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	p := s.Parallel
	switch {
	case s.Steps < 1:
		return fmt.Errorf("job: steps %d: must be at least 1", s.Steps)
	case s.Batch.MicroBatch < 1 || s.Batch.GradAccum < 1:
		return fmt.Errorf("job: batch.micro_batch %d, batch.grad_accum %d: each must be at least 1", s.Batch.MicroBatch, s.Batch.GradAccum)
	case s.Batch.Seq < 0 || s.SeqLen(c) > c.Seq:
		return fmt.Errorf("job: batch.seq %d: must be 1 to the model's seq (%d)", s.Batch.Seq, c.Seq)
	case s.Data.Train == "" && s.Data.Synthetic < s.SeqLen(c)+2:
		return fmt.Errorf("job: data: give data.train (a .bin token file) or data.synthetic tokens (at least seq+2 = %d)", s.SeqLen(c)+2)
	case s.Checkpoint.Every < 0 || s.Checkpoint.Keep < 0:
		return fmt.Errorf("job: checkpoint.every %d, checkpoint.keep %d: must not be negative", s.Checkpoint.Every, s.Checkpoint.Keep)
	case s.Eval.Every < 0 || s.Eval.Batches < 0 || s.LogEvery < 0 || s.Threads < 0:
		return errors.New("job: eval.every, eval.batches, log_every and threads must not be negative")
	case p.DP < 0 || p.TP < 0 || p.PP < 0:
		return fmt.Errorf("job: parallel.dp %d, parallel.tp %d, parallel.pp %d: must not be negative (0 means every rank of the run for dp, 1 for tp and pp)", p.DP, p.TP, p.PP)
	case p.ZeroStage < 0 || p.ZeroStage > 3:
		return fmt.Errorf("job: parallel.zero_stage %d: want 0 (plain data parallel), 1, 2 or 3", p.ZeroStage)
	case p.BucketMB < 0 || p.FirstBucketMB < 0:
		return fmt.Errorf("job: parallel.bucket_mb %g, parallel.first_bucket_mb %g: must not be negative", p.BucketMB, p.FirstBucketMB)
	}
	if err := s.validateCompression(); err != nil {
		return err
	}
	if err := s.validateGrid(c); err != nil {
		return err
	}
	// A micro-batch with one activation buffer beyond any host is one the
	// model cannot build: refused here, naming the keys, not by the ranks.
	rc, _ := model.ParseRecompute(s.Recompute)
	if _, err := model.ActivationUseOf(c, s.Batch.MicroBatch, s.SeqLen(c), rc, 0); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	_, err = s.ZeroConfig()
	return err
}

// validateBounds reports the first count above its upper bound.
func (s Spec) validateBounds() error {
	for _, b := range []struct {
		key    string
		v, max int
	}{
		{"steps", s.Steps, MaxSteps},
		{"batch.micro_batch", s.Batch.MicroBatch, MaxMicroBatch},
		{"batch.grad_accum", s.Batch.GradAccum, MaxGradAccum},
		{"data.synthetic", s.Data.Synthetic, MaxSynthetic},
		{"eval.batches", s.Eval.Batches, MaxEvalBatch},
		{"threads", s.Threads, MaxThreads},
		{"parallel.dp", s.Parallel.DP, MaxDP},
		{"parallel.tp", s.Parallel.TP, MaxDP},
		{"parallel.pp", s.Parallel.PP, MaxDP},
		{"parallel.virtual_stages", s.Parallel.VirtualStages, MaxDP},
	} {
		if b.v > b.max {
			return fmt.Errorf("job: %s %d: must be at most %d", b.key, b.v, b.max)
		}
	}
	p := s.Parallel
	if p.BucketMB > MaxBucketMB || p.FirstBucketMB > MaxBucketMB {
		return fmt.Errorf("job: parallel.bucket_mb %g, parallel.first_bucket_mb %g: must be at most %d", p.BucketMB, p.FirstBucketMB, MaxBucketMB)
	}
	return nil
}

// validateFloats reports the first number of the spec that is NaN or
// infinite: comparisons with NaN are all false, so every range check
// after this one would let it through.
func (s Spec) validateFloats() error {
	o, l := s.Optim, s.LossScale
	for _, f := range []struct {
		key string
		v   float64
	}{
		{"optim.lr", o.LR}, {"optim.min_lr", o.MinLR}, {"optim.beta1", o.Beta1}, {"optim.beta2", o.Beta2},
		{"optim.eps", o.Eps}, {"optim.weight_decay", o.WeightDecay}, {"optim.grad_clip", o.GradClip},
		{"parallel.bucket_mb", s.Parallel.BucketMB}, {"parallel.first_bucket_mb", s.Parallel.FirstBucketMB},
		{"loss_scale.initial_scale", l.InitialScale}, {"loss_scale.min_scale", l.MinScale}, {"loss_scale.static", l.Static},
	} {
		if !finite(f.v) {
			return fmt.Errorf("job: %s %g: must be a finite number", f.key, f.v)
		}
	}
	return nil
}

// ZeroConfig is the spec's data-parallel engine setup.
func (s Spec) ZeroConfig() (zero.Config, error) {
	params, err := comm.ParseDType(s.Precision)
	if err != nil {
		return zero.Config{}, fmt.Errorf("job: precision %q: want fp32, bf16 or fp16", s.Precision)
	}
	grads := params
	if g := s.Parallel.GradDType; g != "" {
		if grads, err = comm.ParseDType(g); err != nil || (grads != comm.Float32 && grads != params) {
			return zero.Config{}, fmt.Errorf("job: parallel.grad_dtype %q: want fp32 or the precision (%s)", g, s.Precision)
		}
	}
	elems := func(mb float64, def float64) int {
		if mb == 0 {
			mb = def
		}
		return max(1, int(mb*(1<<20))/grads.Size())
	}
	c := zero.Config{
		Stage: s.Parallel.ZeroStage, Params: params, Grads: grads,
		FirstBucket: elems(s.Parallel.FirstBucketMB, 1), Bucket: elems(s.Parallel.BucketMB, 25),
		Scaler: s.LossScale, Optim: s.Optim,
	}
	if c.Compress, err = s.compression(); err != nil {
		return c, err
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("job: %w", err)
	}
	return c, nil
}

// Resolved returns s with every default made explicit: the model's preset
// expanded into its fields, the sequence length and the decay horizon. The
// resolved spec is what checkpoints record, so a resumed run does not
// depend on the defaults of the gtrain version that resumes it.
func (s Spec) Resolved() (Spec, error) {
	if err := s.Validate(); err != nil {
		return s, err
	}
	c, _ := s.ModelConfig()
	s.Model.Config = c
	s.Batch.Seq = s.SeqLen(c)
	if s.Optim.DecaySteps == 0 {
		s.Optim.DecaySteps = s.Steps
	}
	if s.Recompute == "" {
		s.Recompute = string(model.RecomputeNone)
	}
	s.Parallel.TP, s.Parallel.PP = max(s.Parallel.TP, 1), max(s.Parallel.PP, 1)
	if s.Parallel.SequenceParallel == nil && s.Parallel.TP > 1 {
		on := true // the planner's default
		s.Parallel.SequenceParallel = &on
	}
	// One spelling of each precision (Validate has parsed it): the trainer
	// tells fp16, which needs loss scaling, by its name.
	p, _ := comm.ParseDType(s.Precision)
	s.Precision = precisionNames[p]
	if c, _ := s.compression(); c.Kind == zero.CompressPowerSGD && s.Parallel.PowerSGDStartStep == nil {
		s.Parallel.PowerSGDStartStep = &c.StartStep
	}
	return s, nil
}

// precisionNames are the spellings of the precisions in a resolved spec.
var precisionNames = map[comm.DType]string{comm.Float32: "fp32", comm.BFloat16: "bf16", comm.Float16: "fp16"}

// compression is parallel.grad_compression and powersgd_start_step.
func (s Spec) compression() (zero.Compression, error) {
	p := s.Parallel
	c, err := zero.ParseCompression(p.GradCompression)
	if err != nil {
		return c, fmt.Errorf("job: parallel.grad_compression: %w", err)
	}
	c.StartStep = DefaultPowerSGDStartStep
	if p.PowerSGDStartStep != nil {
		c.StartStep = *p.PowerSGDStartStep
	}
	if c.StartStep < 0 || c.StartStep > MaxSteps {
		return c, fmt.Errorf("job: parallel.powersgd_start_step %d: must be 0 to %d", c.StartStep, MaxSteps)
	}
	return c, nil
}

// validateCompression refuses gradient compression where it does not
// apply: the tp·pp > 1 path averages over its data-parallel group inside
// zero.DistOptimizer, which does not compress.
func (s Spec) validateCompression() error {
	c, err := s.compression()
	if err != nil || c.Kind == zero.CompressNone {
		return err
	}
	if p := s.Parallel; max(p.TP, 1)*max(p.PP, 1) > 1 {
		return fmt.Errorf("job: parallel.grad_compression %s with tp %d × pp %d: compression applies to the data-parallel path only (tp = pp = 1); set grad_compression none, or tp and pp to 1", c, max(p.TP, 1), max(p.PP, 1))
	}
	return nil
}
