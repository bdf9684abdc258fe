package model

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/tensorpar"
)

// These tests were engine/tensorpar's: they split every GPT-2 parameter,
// and tensorpar's tests cannot import this package, which imports
// tensorpar for Stage.

// TestSplitOf checks the split of every GPT-2 parameter: the column- and
// row-parallel weights of attention and MLP, the vocabulary rows of wte,
// and everything else replicated.
func TestSplitOf(t *testing.T) {
	cfg := Config{Vocab: 11, Seq: 8, Layers: 2, Heads: 4, Embd: 8}
	want := map[string]tensorpar.Split{
		"transformer.wte.weight": tensorpar.Rows, "transformer.wpe.weight": tensorpar.Replicated,
		"ln_1.weight": tensorpar.Replicated, "ln_1.bias": tensorpar.Replicated,
		"attn.c_attn.weight": tensorpar.QKVHeads, "attn.c_attn.bias": tensorpar.QKVHeads,
		"attn.c_proj.weight": tensorpar.Rows, "attn.c_proj.bias": tensorpar.Replicated,
		"ln_2.weight": tensorpar.Replicated, "ln_2.bias": tensorpar.Replicated,
		"mlp.c_fc.weight": tensorpar.Columns, "mlp.c_fc.bias": tensorpar.Columns,
		"mlp.c_proj.weight": tensorpar.Rows, "mlp.c_proj.bias": tensorpar.Replicated,
		"transformer.ln_f.weight": tensorpar.Replicated, "transformer.ln_f.bias": tensorpar.Replicated,
	}
	ps := cfg.Params()
	if len(ps) == 0 {
		t.Fatal("the config has no parameters")
	}
	for _, p := range ps {
		key := p.Name
		if rest, ok := strings.CutPrefix(p.Name, "transformer.h."); ok {
			key = rest[strings.IndexByte(rest, '.')+1:]
		}
		w, ok := want[key]
		if !ok {
			t.Errorf("%s: no expected split (a new parameter?)", p.Name)
			continue
		}
		if got := tensorpar.SplitOf(p.Name); got != w {
			t.Errorf("SplitOf(%s) = %v, want %v", p.Name, got, w)
		}
	}
}

// TestPartsRebuildEveryTensor splits every parameter of a small GPT-2 (its
// vocabulary of 11 uneven over 2 and 4) over tp 1, 2 and 4, and checks that
// the parts have the shapes Shape gives, that split parts are disjoint and
// inserting them all rebuilds the tensor, and that replicated parts are
// the whole tensor.
func TestPartsRebuildEveryTensor(t *testing.T) {
	cfg := Config{Vocab: 11, Seq: 8, Layers: 1, Heads: 4, Embd: 8}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, tp := range []int{1, 2, 4} {
		for _, p := range cfg.Params() {
			full := make([]float32, p.Size())
			for i := range full {
				full[i] = 2*rnd.Float32() - 1
			}
			rebuilt := make([]float32, len(full))
			n := 0
			split := tensorpar.SplitOf(p.Name)
			for r := range tp {
				pt := tensorpar.Part{Split: split, Rank: r, Size: tp, Heads: cfg.Heads}
				shape, err := pt.Shape(p.Shape)
				if err != nil {
					t.Fatalf("tp %d %s: %v", tp, p.Name, err)
				}
				got, err := pt.Extract(full, p.Shape)
				if err != nil {
					t.Fatalf("tp %d %s: %v", tp, p.Name, err)
				}
				if len(got) != (Param{Shape: shape}).Size() {
					t.Fatalf("tp %d rank %d %s: part of %d values, shape %v", tp, r, p.Name, len(got), shape)
				}
				if split == tensorpar.Replicated {
					if !slices.Equal(got, full) {
						t.Fatalf("tp %d rank %d %s: replicated part differs from the tensor", tp, r, p.Name)
					}
					continue
				}
				n += len(got)
				if err := pt.Insert(rebuilt, p.Shape, got); err != nil {
					t.Fatal(err)
				}
			}
			if split == tensorpar.Replicated {
				continue
			}
			if n != len(full) || !slices.Equal(rebuilt, full) {
				t.Fatalf("tp %d %s: the %d values of the parts do not rebuild the %d of the tensor", tp, p.Name, n, len(full))
			}
		}
	}
}
