package tensorpar

import (
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
)

// TestSplitOf and TestPartsRebuildEveryTensor, which split every GPT-2
// parameter, are engine/model's (parallel_split_test.go): the model's
// tensor-parallel stage imports this package, so its tests cannot import
// the model.

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
