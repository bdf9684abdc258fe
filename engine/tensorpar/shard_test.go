package tensorpar

import (
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
)

// TestSplitOf checks the split of every GPT-2 parameter: the column- and
// row-parallel weights of attention and MLP, the vocabulary rows of wte,
// and everything else replicated.
func TestSplitOf(t *testing.T) {
	cfg := model.Config{Vocab: 11, Seq: 8, Layers: 2, Heads: 4, Embd: 8}
	want := map[string]Split{
		"transformer.wte.weight": Rows, "transformer.wpe.weight": Replicated,
		"ln_1.weight": Replicated, "ln_1.bias": Replicated,
		"attn.c_attn.weight": QKVHeads, "attn.c_attn.bias": QKVHeads,
		"attn.c_proj.weight": Rows, "attn.c_proj.bias": Replicated,
		"ln_2.weight": Replicated, "ln_2.bias": Replicated,
		"mlp.c_fc.weight": Columns, "mlp.c_fc.bias": Columns,
		"mlp.c_proj.weight": Rows, "mlp.c_proj.bias": Replicated,
		"transformer.ln_f.weight": Replicated, "transformer.ln_f.bias": Replicated,
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
		if got := SplitOf(p.Name); got != w {
			t.Errorf("SplitOf(%s) = %v, want %v", p.Name, got, w)
		}
	}
}

// TestPartsRebuildEveryTensor splits every parameter of a small GPT-2 (its
// vocabulary of 11 uneven over 2 and 4) over tp 1, 2 and 4, and checks that the
// parts have the shapes Shape gives, that split parts are disjoint and
// inserting them all rebuilds the tensor, and that replicated parts are
// the whole tensor.
func TestPartsRebuildEveryTensor(t *testing.T) {
	cfg := model.Config{Vocab: 11, Seq: 8, Layers: 1, Heads: 4, Embd: 8}
	rnd := newRand(1)
	for _, tp := range []int{1, 2, 4} {
		for _, p := range cfg.Params() {
			full := randSlice(rnd, p.Size(), 1)
			rebuilt := make([]float32, len(full))
			n := 0
			for r := range tp {
				pt := Part{Split: SplitOf(p.Name), Rank: r, Size: tp, Heads: cfg.Heads}
				shape, err := pt.Shape(p.Shape)
				if err != nil {
					t.Fatalf("tp %d %s: %v", tp, p.Name, err)
				}
				got, err := pt.Extract(full, p.Shape)
				if err != nil {
					t.Fatalf("tp %d %s: %v", tp, p.Name, err)
				}
				if len(got) != numel(shape) {
					t.Fatalf("tp %d rank %d %s: part of %d values, shape %v", tp, r, p.Name, len(got), shape)
				}
				if pt.Split == Replicated {
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
			if SplitOf(p.Name) == Replicated {
				continue
			}
			if n != len(full) || !slices.Equal(rebuilt, full) {
				t.Fatalf("tp %d %s: the %d values of the parts do not rebuild the %d of the tensor", tp, p.Name, n, len(full))
			}
		}
	}
}

// TestQKVHeadsTakesEachRanksHeadsFromQKAndV checks the c_attn split
// against its definition, on a weight whose every entry says where it
// came from: rank r's column j·C/tp + c (j = 0, 1, 2 for q, k, v) is full
// column j·C + r·C/tp + c — its heads' columns of each of q, k and v, not
// a contiguous third of the 3C columns.
func TestQKVHeadsTakesEachRanksHeadsFromQKAndV(t *testing.T) {
	const C, NH, rows = 12, 6, 3
	full := make([]float32, rows*3*C)
	for i := range full {
		full[i] = float32(i)
	}
	for _, tp := range []int{1, 2, 3, 6} {
		w := C / tp
		for r := range tp {
			pt := Part{Split: QKVHeads, Rank: r, Size: tp, Heads: NH}
			got, err := pt.Extract(full, []int{rows, 3 * C})
			if err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				for j := range 3 {
					for c := range w {
						if g, want := got[i*3*w+j*w+c], full[i*3*C+j*C+r*w+c]; g != want {
							t.Fatalf("tp %d rank %d: row %d %c column %d = entry %v, want %v", tp, r, i, "qkv"[j], c, g, want)
						}
					}
				}
			}
			b, err := pt.Extract(full[:3*C], []int{3 * C}) // the bias, 1-D
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(b, got[:3*w]) {
				t.Fatalf("tp %d rank %d: bias part %v, want the first row's %v", tp, r, b, got[:3*w])
			}
		}
	}
}

// TestPartErrors checks that impossible splits are errors, not panics.
func TestPartErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		p     Part
		shape []int
	}{
		{"heads not divisible by tp", Part{Split: QKVHeads, Rank: 0, Size: 4, Heads: 6}, []int{4, 36}},
		{"no heads", Part{Split: QKVHeads, Rank: 0, Size: 2}, []int{4, 36}},
		{"width not 3C", Part{Split: QKVHeads, Rank: 0, Size: 2, Heads: 2}, []int{4, 35}},
		{"fewer rows than tp", Part{Split: Rows, Rank: 0, Size: 4}, []int{3, 8}},
		{"rank out of range", Part{Split: Columns, Rank: 2, Size: 2}, []int{3, 8}},
		{"zero dimension", Part{Split: Columns, Rank: 0, Size: 2}, []int{0, 8}},
		{"no dimension", Part{Split: Columns, Rank: 0, Size: 2}, nil},
		{"unknown split", Part{Split: 9, Rank: 0, Size: 2}, []int{3, 8}},
	} {
		if _, err := c.p.Shape(c.shape); err == nil {
			t.Errorf("%s: no error", c.name)
		} else if !strings.HasPrefix(err.Error(), "tensorpar: ") {
			t.Errorf("%s: error %q does not name the package", c.name, err)
		}
	}
	p := Part{Split: Columns, Rank: 0, Size: 2}
	if _, err := p.Extract(make([]float32, 5), []int{2, 3}); err == nil {
		t.Error("extract from 5 values of a 2×3 tensor: no error")
	}
	if err := p.Insert(make([]float32, 6), []int{2, 3}, make([]float32, 3)); err == nil {
		t.Error("insert 3 values as a 2×2 part: no error")
	}
}

// TestBlockIsCommsRule checks Block against engine/comm's documented rule
// for uneven counts: n/p each, one more for the first n%p ranks, in order,
// covering [0, n).
func TestBlockIsCommsRule(t *testing.T) {
	for n := 1; n <= 20; n++ {
		for p := 1; p <= 6; p++ {
			next := 0
			for r := range p {
				lo, hi := comm.Block(n, r, p)
				want := n / p
				if r < n%p {
					want++
				}
				if lo != next || hi-lo != want {
					t.Fatalf("Block(%d, %d, %d) = [%d, %d), want [%d, %d)", n, r, p, lo, hi, next, next+want)
				}
				next = hi
			}
			if next != n {
				t.Fatalf("comm.Block(%d, ·, %d) covers [0, %d)", n, p, next)
			}
		}
	}
}
