package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
)

// testBatch is a deterministic micro-batch of B×T tokens below vocab.
func testBatch(B, T, vocab int, seed uint64) (x, y []int32) {
	rng := rand.New(rand.NewPCG(seed, 1))
	toks := make([]int32, B*T+1)
	for i := range toks {
		toks[i] = int32(rng.IntN(vocab))
	}
	return toks[:B*T], toks[1:]
}

func newTestModel(t *testing.T, cfg Config, B, T int, rc Recompute, threads int) *Model {
	t.Helper()
	m, err := New(cfg, B, T, backend.CPU{Threads: threads}, rc)
	if err != nil {
		t.Fatal(err)
	}
	m.Init(7)
	return m
}

func TestParamsFollowHuggingFace(t *testing.T) {
	c := Presets["gpt2"]
	if got := c.NumParams(); got != 124439808 {
		t.Errorf("gpt2 parameters = %d, want 124439808 (Hugging Face's count, lm_head tied)", got)
	}
	ps := c.Params()
	want := map[string][]int{
		"transformer.wte.weight":             {50257, 768},
		"transformer.h.0.attn.c_attn.weight": {768, 2304},
		"transformer.h.11.mlp.c_proj.weight": {3072, 768},
		"transformer.ln_f.bias":              {768},
	}
	for _, p := range ps {
		if s, ok := want[p.Name]; ok {
			if !slices.Equal(p.Shape, s) {
				t.Errorf("%s shape %v, want %v", p.Name, p.Shape, s)
			}
			delete(want, p.Name)
		}
	}
	for n := range want {
		t.Errorf("no parameter %s", n)
	}
}

func TestInitDeterministic(t *testing.T) {
	cfg := Presets["test"]
	a := newTestModel(t, cfg, 1, 8, RecomputeNone, 1)
	b := newTestModel(t, cfg, 1, 8, RecomputeNone, 1)
	if !slices.Equal(a.Params, b.Params) {
		t.Fatal("two models initialised from one seed differ")
	}
	b.Init(8)
	if slices.Equal(a.Params, b.Params) {
		t.Fatal("different seeds gave the same parameters")
	}
}

// TestInitialLoss: a freshly initialised GPT-2 predicts nearly uniformly,
// so its loss is close to ln(vocab).
func TestInitialLoss(t *testing.T) {
	cfg := Presets["test"]
	m := newTestModel(t, cfg, 2, 16, RecomputeNone, 2)
	x, y := testBatch(2, 16, cfg.Vocab, 1)
	loss, err := m.Forward(x, y)
	if err != nil {
		t.Fatal(err)
	}
	if want := math.Log(float64(cfg.Vocab)); math.Abs(float64(loss)-want) > 0.1 {
		t.Errorf("initial loss %v, want about ln(%d) = %v", loss, cfg.Vocab, want)
	}
}

// TestRecomputeSameGradients: recomputation changes what is kept, never
// what is computed: gradients are bit-identical.
func TestRecomputeSameGradients(t *testing.T) {
	cfg := Config{Layers: 3, Heads: 2, Embd: 16, Seq: 16, Vocab: 50}
	x, y := testBatch(2, 12, cfg.Vocab, 3)
	var ref []float32
	for _, rc := range []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull} {
		m := newTestModel(t, cfg, 2, 12, rc, 2)
		if _, err := m.Forward(x, y); err != nil {
			t.Fatal(err)
		}
		m.Backward(1)
		if ref == nil {
			ref = slices.Clone(m.Grads)
			continue
		}
		if !slices.Equal(ref, m.Grads) {
			t.Errorf("recompute %s: gradients differ from recompute none", rc)
		}
	}
}

// TestModelGradientCheck compares Backward with central finite differences
// of the loss on a few coordinates of every parameter tensor. The loss is
// evaluated in float32: at eps = 1e-3 one rounding of a loss near 2.4 moves
// the difference quotient by ~1.2e-4 (ulp 2.4e-7 / 2eps) and truncation is
// ~1e-2 relative, so the bound is 5e-4 absolute + 1e-2 relative. This
// catches a wrong or missing term; the PyTorch test (float64 reference) is
// the exact one.
func TestModelGradientCheck(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 2, Embd: 8, Seq: 8, Vocab: 11}
	m := newTestModel(t, cfg, 2, 6, RecomputeNone, 1)
	x, y := testBatch(2, 6, cfg.Vocab, 5)
	if _, err := m.Forward(x, y); err != nil {
		t.Fatal(err)
	}
	m.ZeroGrad()
	m.Backward(1)
	loss := func() float64 {
		l, err := m.Forward(x, y)
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	const eps = 1e-3
	for _, p := range m.ParamList() {
		for range 3 {
			i := p.Offset + rng.IntN(p.Size())
			orig := m.Params[i]
			m.Params[i] = orig + eps
			up := loss()
			m.Params[i] = orig - eps
			down := loss()
			m.Params[i] = orig
			num := (up - down) / (2 * eps)
			got := float64(m.Grads[i])
			if math.Abs(num-got) > 5e-4+1e-2*math.Abs(num) {
				t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", p.Name, i-p.Offset, got, num)
			}
		}
	}
}

func TestForwardRejectsBadBatch(t *testing.T) {
	cfg := Presets["test"]
	m := newTestModel(t, cfg, 1, 4, RecomputeNone, 1)
	if _, err := m.Forward(make([]int32, 3), make([]int32, 3)); err == nil {
		t.Error("a batch of the wrong size was accepted")
	}
	x := []int32{1, 2, int32(cfg.Vocab), 3}
	if _, err := m.Forward(x, x); err == nil {
		t.Error("a token outside the vocabulary was accepted")
	}
}
