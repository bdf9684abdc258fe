// Package train is the engine's training loop: it builds the model, the
// optimizer and the data sampler from a job Spec, runs the steps, reports a
// status record per step, and writes and resumes checkpoints.
package train

import (
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
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
}

// EvalSpec is the validation-loss policy; Every 0 disables it.
type EvalSpec struct {
	Every   int `json:"every" mapstructure:"every"`
	Batches int `json:"batches" mapstructure:"batches"`
}

// Parallel is the layout. This engine trains one data-parallel rank with no
// tensor or pipeline parallelism and ZeRO stage 0; larger layouts arrive
// with the distributed engine.
type Parallel struct {
	DP        int `json:"dp" mapstructure:"dp"`
	TP        int `json:"tp" mapstructure:"tp"`
	PP        int `json:"pp" mapstructure:"pp"`
	ZeroStage int `json:"zero_stage" mapstructure:"zero_stage"`
}

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
		Parallel:   Parallel{DP: 1, TP: 1, PP: 1},
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

// Validate reports the first setting that cannot run, naming its key.
func (s Spec) Validate() error {
	c, err := s.ModelConfig()
	if err != nil {
		return fmt.Errorf("job: model: %w", err)
	}
	if err := s.Optim.Validate(); err != nil {
		return fmt.Errorf("job: %w", err)
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
	case p.DP > 1 || p.TP > 1 || p.PP > 1 || p.ZeroStage != 0:
		return fmt.Errorf("job: parallel dp=%d tp=%d pp=%d zero_stage=%d: this engine trains on one rank (dp, tp, pp 1, zero_stage 0); data parallelism and ZeRO arrive with issue 6", p.DP, p.TP, p.PP, p.ZeroStage)
	}
	return nil
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
	if s.Parallel == (Parallel{}) {
		s.Parallel = Parallel{DP: 1, TP: 1, PP: 1}
	}
	return s, nil
}
