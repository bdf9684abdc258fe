package tensorpar

import (
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/engine/comm"
)

// Split is how a tensor is divided over a TP group.
type Split uint8

const (
	// Replicated: every rank holds the whole tensor (LayerNorms, the
	// position embedding, row-parallel biases).
	Replicated Split = iota
	// Rows splits the first dimension: the token embedding's vocabulary
	// rows, and a row-parallel weight's input features (Hugging Face's
	// Conv1D weights are [in, out]).
	Rows
	// Columns splits the last dimension: a column-parallel weight's output
	// features and its bias (c_fc).
	Columns
	// QKVHeads splits the last dimension of c_attn, whose columns are q|k|v
	// of C each, by attention heads: a rank takes its heads' columns from
	// each of q, k and v, and holds them as q_r|k_r|v_r, the layout the
	// attention of its heads expects.
	QKVHeads
)

// String names s.
func (s Split) String() string {
	switch s {
	case Replicated:
		return "replicated"
	case Rows:
		return "rows"
	case Columns:
		return "columns"
	case QKVHeads:
		return "qkv-heads"
	}
	return fmt.Sprintf("split(%d)", uint8(s))
}

// SplitOf is the split of a GPT-2 parameter under Megatron's tensor
// parallelism, by its Hugging Face name (engine/model.Config.Params).
func SplitOf(name string) Split {
	switch {
	case name == "transformer.wte.weight":
		return Rows
	case strings.HasSuffix(name, ".attn.c_attn.weight"), strings.HasSuffix(name, ".attn.c_attn.bias"):
		return QKVHeads
	case strings.HasSuffix(name, ".mlp.c_fc.weight"), strings.HasSuffix(name, ".mlp.c_fc.bias"):
		return Columns
	case strings.HasSuffix(name, ".attn.c_proj.weight"), strings.HasSuffix(name, ".mlp.c_proj.weight"):
		return Rows
	}
	return Replicated
}

// Part is one TP rank's part of a full tensor.
type Part struct {
	Split      Split
	Rank, Size int
	// Heads is the number of attention heads, which QKVHeads needs: it must
	// divide by Size.
	Heads int
}

// Shape returns the shape of p's part of a tensor of shape full.
func (p Part) Shape(full []int) ([]int, error) {
	d, lo, hi, err := p.dim(full)
	if err != nil {
		return nil, err
	}
	s := append([]int(nil), full...)
	if d >= 0 {
		s[d] = hi - lo
		if p.Split == QKVHeads {
			s[d] *= 3
		}
	}
	return s, nil
}

// Extract returns a copy of p's part of full (of shape shape).
func (p Part) Extract(full []float32, shape []int) ([]float32, error) {
	ps, err := p.Shape(shape)
	if err != nil {
		return nil, err
	}
	if err := checkLen("extract "+p.Split.String()+" part", "the tensor", len(full), numel(shape)); err != nil {
		return nil, err
	}
	part := make([]float32, numel(ps))
	p.runs(shape, func(f, q, n int) { copy(part[q:q+n], full[f:f+n]) })
	return part, nil
}

// Insert writes part, p's part, into its place in full (of shape shape):
// the inverse of Extract. Inserting every rank's part rebuilds the tensor.
func (p Part) Insert(full []float32, shape []int, part []float32) error {
	ps, err := p.Shape(shape)
	if err != nil {
		return err
	}
	op := "insert " + p.Split.String() + " part"
	if err := checkLen(op, "the tensor", len(full), numel(shape)); err != nil {
		return err
	}
	if err := checkLen(op, "the part", len(part), numel(ps)); err != nil {
		return err
	}
	p.runs(shape, func(f, q, n int) { copy(full[f:f+n], part[q:q+n]) })
	return nil
}

// dim validates p and shape and returns the split dimension (-1 when
// replicated) and the range [lo, hi) of it that p owns; for QKVHeads, the
// range within each of q, k and v.
func (p Part) dim(shape []int) (d, lo, hi int, err error) {
	if p.Size < 1 || p.Rank < 0 || p.Rank >= p.Size {
		return 0, 0, 0, fmt.Errorf("tensorpar: part: rank %d out of range for tp %d", p.Rank, p.Size)
	}
	if len(shape) == 0 {
		return 0, 0, 0, fmt.Errorf("tensorpar: part: a tensor without dimensions cannot be split")
	}
	for _, n := range shape {
		if n < 1 {
			return 0, 0, 0, fmt.Errorf("tensorpar: part: shape %v has a dimension below 1", shape)
		}
	}
	n := shape[len(shape)-1]
	switch p.Split {
	case Replicated:
		return -1, 0, 0, nil
	case Rows:
		d, n = 0, shape[0]
	case Columns:
		d = len(shape) - 1
	case QKVHeads:
		d = len(shape) - 1
		if n%3 != 0 || p.Heads < 1 || (n/3)%p.Heads != 0 || p.Heads%p.Size != 0 {
			return 0, 0, 0, fmt.Errorf("tensorpar: part: %d q|k|v columns over %d heads and tp %d: the heads must divide the width and tp the heads", n, p.Heads, p.Size)
		}
		n /= 3
	default:
		return 0, 0, 0, fmt.Errorf("tensorpar: part: unknown split %v", p.Split)
	}
	if n < p.Size {
		return 0, 0, 0, fmt.Errorf("tensorpar: part: dimension %d of shape %v has %d entries, fewer than tp %d", d, shape, n, p.Size)
	}
	lo, hi = comm.Block(n, p.Rank, p.Size)
	return d, lo, hi, nil
}

// runs calls f(fullOffset, partOffset, n) for each contiguous run of p's
// part of a tensor of shape (already validated by dim).
func (p Part) runs(shape []int, f func(full, part, n int)) {
	d, lo, hi, _ := p.dim(shape)
	total, w := numel(shape), shape[len(shape)-1]
	switch {
	case d < 0:
		f(0, 0, total)
	case p.Split == Rows:
		row := total / shape[0]
		f(lo*row, 0, (hi-lo)*row)
	case p.Split == Columns:
		for r := range total / w {
			f(r*w+lo, r*(hi-lo), hi-lo)
		}
	default: // QKVHeads
		c, k := w/3, hi-lo
		for r := range total / w {
			for j := range 3 {
				f(r*w+j*c+lo, (r*3+j)*k, k)
			}
		}
	}
}

// numel is the number of elements of a tensor of shape s.
func numel(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}
