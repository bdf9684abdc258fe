// Package model is GPT-2 in Go: a decoder-only transformer with pre-LayerNorm
// blocks, learned positions, tanh-GELU and an output layer tied to the token
// embedding. Parameters live in one flat float32 slice and carry the Hugging
// Face GPT-2 names (transformer.h.0.attn.c_attn.weight, ...) and shapes
// (Conv1D weights stored input × output), so weights round-trip to PyTorch.
package model

import (
	"fmt"
	"sort"
	"strings"
)

// Config is the shape of a model.
type Config struct {
	Layers int `json:"layers" mapstructure:"layers"` // transformer blocks
	Heads  int `json:"heads" mapstructure:"heads"`   // attention heads per block
	Embd   int `json:"embd" mapstructure:"embd"`     // hidden size; a multiple of Heads
	Seq    int `json:"seq" mapstructure:"seq"`       // maximum sequence length (learned positions)
	Vocab  int `json:"vocab" mapstructure:"vocab"`   // vocabulary size
}

// Presets are the named model shapes, from a test size to GPT-2 XL. The
// small ones use the engine's byte-level vocabulary (257 tokens); the GPT-2
// ones its BPE vocabulary (50257).
var Presets = map[string]Config{
	"test":        {Layers: 2, Heads: 2, Embd: 32, Seq: 64, Vocab: 257},
	"tiny":        {Layers: 4, Heads: 4, Embd: 128, Seq: 128, Vocab: 257},
	"small":       {Layers: 6, Heads: 6, Embd: 384, Seq: 256, Vocab: 257},
	"gpt2":        {Layers: 12, Heads: 12, Embd: 768, Seq: 1024, Vocab: 50257},
	"gpt2-medium": {Layers: 24, Heads: 16, Embd: 1024, Seq: 1024, Vocab: 50257},
	"gpt2-large":  {Layers: 36, Heads: 20, Embd: 1280, Seq: 1024, Vocab: 50257},
	"gpt2-xl":     {Layers: 48, Heads: 25, Embd: 1600, Seq: 1024, Vocab: 50257},
}

// Preset returns the named preset, or an error listing the known names.
func Preset(name string) (Config, error) {
	c, ok := Presets[name]
	if !ok {
		return Config{}, fmt.Errorf("model: unknown preset %q: want one of %s", name, strings.Join(PresetNames(), ", "))
	}
	return c, nil
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Upper bounds of a model's shape. They are far above any published
// model (GPT-3 175B: 96 layers, 96 heads, 12288 hidden; Megatron's 1T: 128
// layers, 25600 hidden; the longest contexts about a million tokens) and
// keep every size computed from a shape (parameter counts, activation
// elements) well inside an int64, so that a typo such as layers=100000 is
// an error naming the key instead of an allocation without end.
const (
	MaxLayers = 1024
	MaxHeads  = 1024
	MaxEmbd   = 1 << 16
	MaxSeq    = 1 << 20
)

// Validate reports the first field that makes c unusable.
func (c Config) Validate() error {
	switch {
	case c.Layers < 1 || c.Layers > MaxLayers:
		return fmt.Errorf("model: layers %d: must be 1 to %d", c.Layers, MaxLayers)
	case c.Heads < 1 || c.Heads > MaxHeads:
		return fmt.Errorf("model: heads %d: must be 1 to %d", c.Heads, MaxHeads)
	case c.Embd < 1 || c.Embd > MaxEmbd || c.Embd%c.Heads != 0:
		return fmt.Errorf("model: embd %d: must be a positive multiple of heads (%d), at most %d", c.Embd, c.Heads, MaxEmbd)
	case c.Seq < 1 || c.Seq > MaxSeq:
		return fmt.Errorf("model: seq %d: must be 1 to %d", c.Seq, MaxSeq)
	case c.Vocab < 2 || c.Vocab > 1<<16:
		return fmt.Errorf("model: vocab %d: must be 2-65536 (tokens are stored as uint16)", c.Vocab)
	}
	return nil
}

// Param describes one named parameter tensor: where it sits in the flat
// parameter slice and its shape.
type Param struct {
	Name   string
	Shape  []int
	Offset int  // into the flat slice
	Decay  bool // weight decay applies (matrices and embeddings, not biases or norms)
}

// Size is the number of elements of p.
func (p Param) Size() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Params lists c's parameters in Hugging Face GPT-2 order and naming. The
// output layer is tied to transformer.wte.weight and has no entry of its own.
func (c Config) Params() []Param {
	C, L := c.Embd, c.Layers
	var ps []Param
	off := 0
	add := func(name string, decay bool, shape ...int) {
		p := Param{Name: name, Shape: shape, Offset: off, Decay: decay}
		off += p.Size()
		ps = append(ps, p)
	}
	add("transformer.wte.weight", true, c.Vocab, C)
	add("transformer.wpe.weight", true, c.Seq, C)
	for l := range L {
		h := fmt.Sprintf("transformer.h.%d.", l)
		add(h+"ln_1.weight", false, C)
		add(h+"ln_1.bias", false, C)
		add(h+"attn.c_attn.weight", true, C, 3*C)
		add(h+"attn.c_attn.bias", false, 3*C)
		add(h+"attn.c_proj.weight", true, C, C)
		add(h+"attn.c_proj.bias", false, C)
		add(h+"ln_2.weight", false, C)
		add(h+"ln_2.bias", false, C)
		add(h+"mlp.c_fc.weight", true, C, 4*C)
		add(h+"mlp.c_fc.bias", false, 4*C)
		add(h+"mlp.c_proj.weight", true, 4*C, C)
		add(h+"mlp.c_proj.bias", false, C)
	}
	add("transformer.ln_f.weight", false, C)
	add("transformer.ln_f.bias", false, C)
	return ps
}

// NumParams is the total number of parameters (the tied output layer
// counted once).
func (c Config) NumParams() int {
	ps := c.Params()
	last := ps[len(ps)-1]
	return last.Offset + last.Size()
}
