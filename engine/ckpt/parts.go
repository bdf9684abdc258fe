package ckpt

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gtrain/gtrain/engine/tensorpar"
)

// splitsByName are the tensorpar splits a PartRef may name: a replicated
// tensor is whole and has no PartRef.
var splitsByName = map[string]tensorpar.Split{
	tensorpar.Rows.String():     tensorpar.Rows,
	tensorpar.Columns.String():  tensorpar.Columns,
	tensorpar.QKVHeads.String(): tensorpar.QKVHeads,
}

// isWhole reports whether p is the whole tensor: replicated, or the one
// part of a TP group of one (whose layout is the full tensor's, q|k|v
// included).
func isWhole(p tensorpar.Part) bool {
	return p.Split == tensorpar.Replicated || p.Size == 1 && p.Rank == 0
}

// partRefOf is p as the manifest lists it: the zero PartRef when p is the
// whole tensor, and Heads only where the split uses it, so that one part
// has one spelling.
func partRefOf(p tensorpar.Part) PartRef {
	if isWhole(p) {
		return PartRef{}
	}
	r := PartRef{Split: p.Split.String(), Rank: p.Rank, Size: p.Size}
	if p.Split == tensorpar.QKVHeads {
		r.Heads = p.Heads
	}
	return r
}

// IsZero reports whether r is no part: the shard is of the whole tensor.
func (r PartRef) IsZero() bool { return r == PartRef{} }

// String is e.g. "tp part 1 of 2 (columns)".
func (r PartRef) String() string {
	if r.IsZero() {
		return "the whole tensor"
	}
	s := fmt.Sprintf("tp part %d of %d (%s", r.Rank, r.Size, r.Split)
	if r.Heads != 0 {
		s += fmt.Sprintf(", %d heads", r.Heads)
	}
	return s + ")"
}

// part is the tensorpar.Part r names, checked for what does not depend on
// the tensor's shape; the zero PartRef is the whole tensor.
func (r PartRef) part() (tensorpar.Part, error) {
	if r.IsZero() {
		return tensorpar.Part{Split: tensorpar.Replicated, Size: 1}, nil
	}
	split, ok := splitsByName[r.Split]
	switch {
	case !ok:
		return tensorpar.Part{}, fmt.Errorf("%v: unknown split %q, want rows, columns or qkv-heads", r, r.Split)
	case r.Size < 2 || r.Size > maxWorld || r.Rank < 0 || r.Rank >= r.Size:
		return tensorpar.Part{}, fmt.Errorf("%v: want a rank below a size of 2 to %d (a whole tensor is listed without a part)", r, maxWorld)
	case (split == tensorpar.QKVHeads) != (r.Heads != 0) || r.Heads < 0 || r.Heads > maxWorld:
		return tensorpar.Part{}, fmt.Errorf("%v: heads %d: a qkv-heads split needs them (1 to %d), the others must not have them", r, r.Heads, maxWorld)
	}
	return tensorpar.Part{Split: split, Rank: r.Rank, Size: r.Size, Heads: r.Heads}, nil
}

// partNumel is the number of elements of part r of a tensor of shape, or
// an error when r does not fit the shape.
func (r PartRef) partNumel(shape []int) (int, error) {
	p, err := r.part()
	if err != nil {
		return 0, err
	}
	if r.IsZero() {
		return numelOf(shape, maxElems)
	}
	ps, err := p.Shape(shape)
	if err != nil {
		return 0, fmt.Errorf("%v does not fit shape %v: %w", r, shape, err)
	}
	return numelOf(ps, maxElems)
}

// maxElems bounds the elements of a tensor, so that byte offsets fit an
// int64.
const maxElems = (1<<63 - 1) / 8

// hasPart reports whether s is of a tensor-parallel part.
func hasPart(s ShardRef) bool { return !s.Part.IsZero() }

// sortShards puts the shards of one tensor in the manifest's order:
// without parts by offset (as every checkpoint before parts had them);
// with parts by part rank, then offset, length and file, a total order, so
// Commit and Open build the same index.
func sortShards(shards []ShardRef) {
	if !slices.ContainsFunc(shards, hasPart) {
		sort.Slice(shards, func(i, j int) bool { return shards[i].Offset < shards[j].Offset })
		return
	}
	slices.SortStableFunc(shards, func(a, b ShardRef) int {
		switch {
		case a.Part.Rank != b.Part.Rank:
			return a.Part.Rank - b.Part.Rank
		case a.Offset != b.Offset:
			return a.Offset - b.Offset
		case a.Len != b.Len:
			return a.Len - b.Len
		}
		return cmpString(a.File, b.File)
	})
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkTensorShards checks that shards hold every element of a tensor of
// shape exactly once. Shards without parts must tile [0, numel) as they
// always did. Shards with parts must all be parts of one TP layout (one
// split, size and head count), every part of it present, and each part's
// shards must tile that part; a whole-tensor shard beside parts overlaps
// them. It sorts the shards (sortShards' order).
func checkTensorShards(shards []ShardRef, shape []int, numel int) error {
	if !slices.ContainsFunc(shards, hasPart) {
		return checkShards(shards, numel)
	}
	sortShards(shards)
	layout := shards[slices.IndexFunc(shards, hasPart)].Part
	layout.Rank = 0 // the part expected next
	for len(shards) > 0 {
		ref := shards[0].Part
		n := 1
		for n < len(shards) && shards[n].Part == ref {
			n++
		}
		if err := checkPartGroup(layout, ref, shards[:n], shape); err != nil {
			return err
		}
		layout.Rank++
		shards = shards[n:]
	}
	if layout.Rank != layout.Size {
		return fmt.Errorf("no shard holds %v: the parts do not tile the tensor", PartRef{Split: layout.Split, Rank: layout.Rank, Size: layout.Size, Heads: layout.Heads})
	}
	return nil
}

// checkPartGroup checks the shards of one part, ref, where the next part of
// the layout, want, was expected.
func checkPartGroup(want, ref PartRef, shards []ShardRef, shape []int) error {
	if ref.IsZero() {
		return fmt.Errorf("the whole tensor (in %s) is listed beside %v: they overlap", shards[0].File, want)
	}
	numel, err := ref.partNumel(shape)
	if err != nil {
		return err
	}
	if ref.Split != want.Split || ref.Size != want.Size || ref.Heads != want.Heads {
		return fmt.Errorf("%v (in %s) and %v: parts of two layouts overlap", ref, shards[0].File, want)
	}
	if ref.Rank != want.Rank {
		if ref.Rank < want.Rank {
			return fmt.Errorf("%v is listed twice (in %s): the parts overlap", ref, shards[0].File)
		}
		return fmt.Errorf("no shard holds %v: the parts do not tile the tensor", want)
	}
	if err := checkShards(shards, numel); err != nil {
		return fmt.Errorf("%v: %w", ref, err)
	}
	return nil
}
