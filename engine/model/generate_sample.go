package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// SampleOptions are how Generate picks each token, as nanoGPT's sample.py
// does: logits divided by Temperature, all but the TopK largest dropped,
// then a draw from the softmax.
type SampleOptions struct {
	Tokens      int     // tokens to generate
	Temperature float64 // 0: greedy, the most likely token (the lowest id on a tie)
	TopK        int     // 0 or at least Vocab: no cut
	// Vocab bounds the ids drawn: the tokenizer's vocabulary, when the
	// model's is padded beyond it (nanoGPT's 50304); 0 is the model's.
	Vocab int
}

// Generate feeds prompt (at least one token, at most the model's Seq) and
// returns opts.Tokens tokens drawn after it with rng. When the context
// fills, the older half of it is dropped and the rest fed again: nanoGPT
// crops its context to block_size each step, at the cost of a whole
// forward per token; this keeps generation linear in its length, each
// token seeing between Seq/2 and Seq tokens before it. It stops with
// ctx's cause when ctx ends.
func (d *Decoder) Generate(ctx context.Context, prompt []int, opts SampleOptions, rng *rand.Rand) ([]int, error) {
	seq := d.cfg.Seq
	if len(prompt) == 0 || len(prompt) > seq {
		return nil, fmt.Errorf("model: generate: a prompt of %d tokens: want 1 to the model's context, %d", len(prompt), seq)
	}
	vocab := d.cfg.Vocab
	if opts.Vocab > 0 {
		vocab = min(vocab, opts.Vocab)
	}
	window := slices.Clone(prompt)
	logits, err := d.feed(window)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, opts.Tokens)
	scratch := make([]float64, vocab)
	for len(out) < opts.Tokens {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		next := sampleToken(logits[:vocab], opts.Temperature, opts.TopK, rng, scratch)
		out = append(out, next)
		window = append(window, next)
		if len(out) == opts.Tokens {
			break
		}
		if d.Len() < seq {
			logits, err = d.Next(next)
		} else {
			window = append(window[:0], window[len(window)-seq/2-1:]...)
			logits, err = d.feed(window)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// feed resets the cache and feeds toks, returning the last logits.
func (d *Decoder) feed(toks []int) ([]float32, error) {
	d.Reset()
	var logits []float32
	for _, t := range toks {
		var err error
		if logits, err = d.Next(t); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// sampleToken draws an id from logits: the first largest at temperature
// 0, else from softmax(logits/temperature) over the topK largest (all of
// those tied with the k-th, as torch.topk's cut in sample.py keeps them).
// scratch holds len(logits) values.
func sampleToken(logits []float32, temperature float64, topK int, rng *rand.Rand, scratch []float64) int {
	if temperature <= 0 || topK == 1 {
		best := 0
		for i, l := range logits {
			if l > logits[best] {
				best = i
			}
		}
		return best
	}
	p := scratch[:len(logits)]
	for i, l := range logits {
		p[i] = float64(l) / temperature
	}
	cut := math.Inf(-1)
	if topK > 0 && topK < len(p) {
		sorted := slices.Clone(p)
		slices.Sort(sorted)
		cut = sorted[len(sorted)-topK]
	}
	mx := slices.Max(p)
	var sum float64
	for i, v := range p {
		if v < cut {
			p[i] = 0
			continue
		}
		p[i] = math.Exp(v - mx)
		sum += p[i]
	}
	u := rng.Float64() * sum
	last := 0
	for i, w := range p {
		if w == 0 {
			continue
		}
		if u < w {
			return i
		}
		u -= w
		last = i
	}
	return last // u met rounding at the end of the sum
}
