// Package generate samples text from a checkpoint of the built-in engine on
// this machine (gtrain generate), as nanoGPT's sample.py does: it loads the
// full tensors from a checkpoint of any layout, builds the dense GPT, and
// draws tokens one at a time through engine/model's KV-cache Decoder,
// decoding them with the tokenizer the run's data was prepared with.
package generate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/internal/usage"
)

// Bounds of a request: far above a use and small enough that a typo is an
// error, not hours of work or an allocation without end.
const (
	MaxTokens     = 1 << 20 // tokens per sample
	MaxSamples    = 1 << 12
	MaxPromptSize = 1 << 20 // bytes of prompt text
	MaxTemp       = 100
	MaxThreads    = 4096 // compute goroutines, as a training rank's
)

// Request is a generation: the flags of gtrain generate.
type Request struct {
	Op          string // the command, first in errors: "generate"
	From        string // a run's checkpoint directory, or one step directory
	Prompt      string // "<|endoftext|>" stands for EOT; empty starts a document (EOT)
	Tokens      int    // tokens to generate per sample
	NumSamples  int
	Temperature float64 // 0: greedy
	TopK        int     // 0: no cut
	Seed        uint64
	Tokenizer   string // "": the run's (its data's meta.json)
	Threads     int    // 0: this machine's CPUs
	Warn        func(string)
}

// Sample is one generated continuation.
type Sample struct {
	Text   string `json:"text"`   // the generated text alone, without the prompt
	Tokens []int  `json:"tokens"` // its ids
}

// Result is what Run generated, and from what.
type Result struct {
	Checkpoint   string   `json:"checkpoint"` // the step directory loaded
	Step         int64    `json:"step"`
	Tokenizer    string   `json:"tokenizer"`
	Prompt       string   `json:"prompt"`         // the prompt as the model saw it (decoded, after cropping)
	PromptTokens []int    `json:"prompt_tokens"`  // its ids
	Cropped      int      `json:"cropped_tokens"` // prompt tokens dropped from the left to fit the context
	Seed         uint64   `json:"seed"`
	Temperature  float64  `json:"temperature"`
	TopK         int      `json:"top_k"`
	Samples      []Sample `json:"samples"`
}

// check refuses a request that cannot run, before anything is read.
func (r Request) check() error {
	switch {
	case r.Tokens < 1 || r.Tokens > MaxTokens:
		return usage.Errorf("%s: --tokens %d: want 1 to %d", r.Op, r.Tokens, MaxTokens)
	case r.NumSamples < 1 || r.NumSamples > MaxSamples:
		return usage.Errorf("%s: --num-samples %d: want 1 to %d", r.Op, r.NumSamples, MaxSamples)
	case math.IsNaN(r.Temperature) || r.Temperature < 0 || r.Temperature > MaxTemp:
		return usage.Errorf("%s: --temperature %v: want 0 (greedy) to %d", r.Op, r.Temperature, MaxTemp)
	case r.Threads < 0 || r.Threads > MaxThreads:
		return usage.Errorf("%s: --threads %d: want 0 (this machine's CPUs) to %d", r.Op, r.Threads, MaxThreads)
	case r.TopK < 0:
		return usage.Errorf("%s: --top-k %d: want 0 (no cut) or more", r.Op, r.TopK)
	case len(r.Prompt) > MaxPromptSize:
		return usage.Errorf("%s: --prompt of %d bytes: at most %d (the model sees only its last context's worth of tokens)", r.Op, len(r.Prompt), MaxPromptSize)
	case r.Tokenizer != "" && r.Tokenizer != data.TokenizerBytes && r.Tokenizer != data.TokenizerGPT2:
		return usage.Errorf("%s: --tokenizer %q: want %s", r.Op, r.Tokenizer, strings.Join(data.TokenizerNames, " or "))
	}
	return nil
}

// Run loads the checkpoint r names (verified; a root's newest valid one)
// and generates r.NumSamples continuations of r.Prompt. A prompt longer
// than the model's context is cropped from the left, as sample.py crops to
// block_size, and r.Warn hears of it. When ctx ends, Run returns its cause.
func Run(ctx context.Context, r Request) (*Result, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	target, err := ckpt.ResolveArg(r.Op, r.From)
	if err != nil {
		return nil, err
	}
	c, err := target.Load(ctx, r.Warn)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		var inv *ckpt.InvalidError
		if errors.As(err, &inv) {
			return nil, fmt.Errorf("%s: %w; give an older step directory, or check the run with gtrain ckpt ls", r.Op, err)
		}
		return nil, fmt.Errorf("%s: %w", r.Op, err)
	}
	cfg, train, err := modelOf(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", r.Op, c.Dir, err)
	}
	tok, err := r.tokenizer(train, cfg.Vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Op, err)
	}
	params, err := loadParams(ctx, c, cfg)
	if err != nil {
		return nil, err
	}
	return r.sample(ctx, c, cfg, params, tok)
}

// modelOf is the checkpoint's model shape and data file, from its job.
func modelOf(c *ckpt.Checkpoint) (model.Config, string, error) {
	jm, err := c.Manifest.JobModel()
	if err != nil {
		return model.Config{}, "", err
	}
	cfg := model.Config{Layers: jm.Layers, Heads: jm.Heads, Embd: jm.Embd, Seq: jm.Seq, Vocab: jm.Vocab}
	return cfg, jm.DataTrain, cfg.Validate()
}

// tokenizer is the one asked for, or the run's.
func (r Request) tokenizer(train string, vocab int) (data.Tokenizer, error) {
	if r.Tokenizer != "" {
		return data.NewTokenizer(r.Tokenizer)
	}
	tok, note, err := data.RunTokenizer(train, vocab)
	if err == nil && note != "" && r.Warn != nil {
		r.Warn(note)
	}
	return tok, err
}

// loadParams reads every parameter, whatever layout wrote the checkpoint,
// into one flat slice in Params order.
func loadParams(ctx context.Context, c *ckpt.Checkpoint, cfg model.Config) ([]float32, error) {
	flat := make([]float32, cfg.NumParams())
	for _, p := range cfg.Params() {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err := c.ReadRange(p.Name, 0, flat[p.Offset:p.Offset+p.Size()]); err != nil {
			return nil, err
		}
	}
	return flat, nil
}

// sample encodes the prompt, crops it to the context, and draws the
// samples in turn from one seeded generator: the same request gives the
// same text.
func (r Request) sample(ctx context.Context, c *ckpt.Checkpoint, cfg model.Config, params []float32, tok data.Tokenizer) (*Result, error) {
	threads := r.Threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	d, err := model.NewDecoder(cfg, params, backend.CPU{Threads: threads})
	if err != nil {
		return nil, err
	}
	ids := data.EncodePrompt(tok, r.Prompt)
	if len(ids) == 0 {
		ids = []uint16{uint16(tok.EOT())}
	}
	res := &Result{Checkpoint: c.Dir, Step: c.Step(), Tokenizer: tok.Name(), Seed: r.Seed, Temperature: r.Temperature, TopK: r.TopK}
	if over := len(ids) - cfg.Seq; over > 0 {
		ids, res.Cropped = ids[over:], over
		if r.Warn != nil {
			r.Warn(fmt.Sprintf("the prompt is %d tokens, the model's context %d: using its last %d", over+cfg.Seq, cfg.Seq, cfg.Seq))
		}
	}
	res.Prompt = tok.Decode(ids)
	for _, id := range ids {
		if int(id) >= cfg.Vocab {
			return nil, usage.Errorf("%s: the prompt has token %d, outside the model's vocabulary of %d: is --tokenizer the run's?", r.Op, id, cfg.Vocab)
		}
		res.PromptTokens = append(res.PromptTokens, int(id))
	}
	rng := rand.New(rand.NewPCG(r.Seed, 0x67656e)) // "gen"
	opts := model.SampleOptions{Tokens: r.Tokens, Temperature: r.Temperature, TopK: r.TopK, Vocab: tok.VocabSize()}
	for range r.NumSamples {
		out, err := d.Generate(ctx, res.PromptTokens, opts, rng)
		if err != nil {
			return nil, err
		}
		toks := make([]uint16, len(out))
		for i, id := range out {
			toks[i] = uint16(id)
		}
		res.Samples = append(res.Samples, Sample{Text: tok.Decode(toks), Tokens: out})
	}
	return res, nil
}
