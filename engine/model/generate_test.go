package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
)

// TestDecoderMatchesForward: the decoder's logits at every position of a
// sequence fed token by token through its KV cache give the probabilities
// of the full forward over the whole sequence, within float32 rounding;
// after a Reset the same tokens give the same logits bit for bit.
func TestDecoderMatchesForward(t *testing.T) {
	cfg := Presets["test"] // 2 layers, 2 heads, 32 wide, context 64, vocabulary 257
	const T = 40
	m := newTestModel(t, cfg, 1, T, RecomputeNone, 1)
	x, y := testBatch(1, T, cfg.Vocab, 3)
	if _, err := m.Forward(x, y); err != nil {
		t.Fatal(err)
	}
	probs := m.acts.probs // (T, V): softmax of the full forward's logits
	d, err := NewDecoder(cfg, m.Params, backend.CPU{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	var first [][]float32
	for pass := range 2 {
		d.Reset()
		for pos := range T {
			logits, err := d.Next(int(x[pos]))
			if err != nil {
				t.Fatal(err)
			}
			if pass == 1 {
				if !slices.Equal(logits, first[pos]) {
					t.Fatalf("position %d: logits after Reset differ from the first pass", pos)
				}
				continue
			}
			first = append(first, slices.Clone(logits))
			want := probs[pos*cfg.Vocab : (pos+1)*cfg.Vocab]
			if diff := maxDiff(softmax(logits), want); diff > 2e-6 {
				t.Errorf("position %d: probabilities differ from the full forward's by %g", pos, diff)
			}
		}
	}
	if d.Len() != T {
		t.Errorf("Len = %d after %d tokens", d.Len(), T)
	}
}

func softmax(logits []float32) []float32 {
	mx := slices.Max(logits)
	out := make([]float32, len(logits))
	var sum float64
	for i, l := range logits {
		e := math.Exp(float64(l - mx))
		out[i] = float32(e)
		sum += e
	}
	for i := range out {
		out[i] = float32(float64(out[i]) / sum)
	}
	return out
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// TestDecoderBounds: a full cache, a token outside the vocabulary and a
// parameter slice of the wrong size are errors, not panics.
func TestDecoderBounds(t *testing.T) {
	cfg := Config{Layers: 1, Heads: 1, Embd: 8, Seq: 4, Vocab: 10}
	if _, err := NewDecoder(cfg, make([]float32, 3), backend.CPU{}); err == nil {
		t.Error("NewDecoder took 3 parameters")
	}
	d, err := NewDecoder(cfg, make([]float32, cfg.NumParams()), backend.CPU{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []int{-1, 10} {
		if _, err := d.Next(tok); err == nil {
			t.Errorf("Next(%d) took a token outside the vocabulary of 10", tok)
		}
	}
	for range 4 {
		if _, err := d.Next(1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Next(1); err == nil {
		t.Error("Next on a full cache did not fail")
	}
	if _, err := d.Generate(context.Background(), make([]int, 5), SampleOptions{Tokens: 1}, rand.New(rand.NewPCG(1, 1))); err == nil {
		t.Error("Generate took a prompt longer than the context")
	}
}

// TestGenerateSlidesContext: generating past the context drops its older
// half and goes on; greedy decoding is the same run after run, and each
// token is the argmax of a decoder fed its window from scratch.
func TestGenerateSlidesContext(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 2, Embd: 16, Seq: 8, Vocab: 20}
	params := make([]float32, cfg.NumParams())
	InitParams(cfg, 5, params)
	d, err := NewDecoder(cfg, params, backend.CPU{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	opts := SampleOptions{Tokens: 30}
	a, err := d.Generate(context.Background(), []int{1, 2, 3}, opts, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := d.Generate(context.Background(), []int{1, 2, 3}, opts, rand.New(rand.NewPCG(9, 9)))
	if len(a) != 30 || !slices.Equal(a, b) {
		t.Fatalf("greedy: %v then %v; want 30 tokens, the same", a, b)
	}
	// Replay: the window Generate keeps when the cache is full.
	ref, _ := NewDecoder(cfg, params, backend.CPU{Threads: 1})
	window := []int{1, 2, 3}
	for i, tok := range a {
		logits, err := ref.feed(window)
		if err != nil {
			t.Fatal(err)
		}
		if want := sampleToken(logits, 0, 0, nil, nil); tok != want {
			t.Fatalf("token %d = %d, want %d, the argmax after %v", i, tok, want, window)
		}
		window = append(window, tok)
		if len(window) > cfg.Seq {
			window = window[len(window)-cfg.Seq/2-1:]
		}
	}
}

// TestSampleToken: temperature 0 and top-k 1 are the argmax; top-k keeps
// only the k largest; draws follow the softmax; a seed fixes them.
func TestSampleToken(t *testing.T) {
	logits := []float32{0, float32(math.Log(3)), -1, 2}
	scratch := make([]float64, len(logits))
	if got := sampleToken(logits, 0, 0, nil, scratch); got != 3 {
		t.Errorf("greedy = %d, want 3", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	if got := sampleToken(logits, 5, 1, rng, scratch); got != 3 {
		t.Errorf("top-k 1 = %d, want 3", got)
	}
	counts := make([]int, len(logits))
	const n = 40000
	for range n {
		counts[sampleToken(logits[:2], 1, 0, rng, scratch)]++
	}
	if f := float64(counts[1]) / n; math.Abs(f-0.75) > 0.01 {
		t.Errorf("p(1) = %.3f, want 0.75 = 3/(1+3)", f)
	}
	clear(counts)
	for range 1000 {
		counts[sampleToken(logits, 1, 2, rng, scratch)]++
	}
	if counts[0] != 0 || counts[2] != 0 || counts[1] == 0 || counts[3] == 0 {
		t.Errorf("top-k 2 drew %v: want only ids 1 and 3", counts)
	}
	draw := func(seed uint64) []int {
		r := rand.New(rand.NewPCG(seed, seed))
		var out []int
		for range 50 {
			out = append(out, sampleToken(logits, 1, 0, r, scratch))
		}
		return out
	}
	if !slices.Equal(draw(7), draw(7)) || slices.Equal(draw(7), draw(8)) {
		t.Error("draws do not follow the seed")
	}
}

// BenchmarkDecoderTokens generates N tokens after a one-token prompt with
// a small model whose context holds them all: ns/token stays roughly flat
// as N doubles (the matmuls per token are fixed; attention over the cache
// grows by C per cached token, small next to them), where a forward over
// the whole sequence per token would double it.
func BenchmarkDecoderTokens(b *testing.B) {
	cfg := Config{Layers: 4, Heads: 4, Embd: 128, Seq: 512, Vocab: 257}
	params := make([]float32, cfg.NumParams())
	InitParams(cfg, 1, params)
	for _, n := range []int{64, 128, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			d, err := NewDecoder(cfg, params, backend.CPU{Threads: 1})
			if err != nil {
				b.Fatal(err)
			}
			opts := SampleOptions{Tokens: n, Temperature: 1, TopK: 50}
			for b.Loop() {
				if _, err := d.Generate(context.Background(), []int{0}, opts, rand.New(rand.NewPCG(1, 1))); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
		})
	}
}
