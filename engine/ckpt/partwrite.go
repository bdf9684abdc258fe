package ckpt

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gtrain/gtrain/engine/tensorpar"
)

// metaParts is the metadata key of a rank file's tensor-parallel parts
// (JSON: name → PartRef), for the tensors that are parts of one. A file
// without parts has no such key, so it is byte for byte what WriteShard
// writes.
const metaParts = "gtrain.parts"

// PartTensor is a tensor as a rank of a tensor-parallel layout holds it:
// Data are the elements [Offset, Offset+len(Data)) of Part's part
// (flattened in the part's shape, as tensorpar.Part.Extract cuts it) of
// the full tensor Name of shape Shape. Offset is 0 and Data the whole part
// unless ZeRO splits the part over DP ranks. A replicated Part, or the one
// part of a TP group of one, is the whole tensor: Offset is then into the
// full tensor, as a Tensor's.
type PartTensor struct {
	Name   string
	Shape  []int // the full tensor's shape
	Part   tensorpar.Part
	Offset int // element offset of Data in the part
	Data   []float32
}

// WriteParts writes rank's file of step's checkpoint as WriteShard does
// (safetensors, its SHA-256 computed while it is written, atomically),
// from its parts of the full tensors; rank 0 then passes every rank's File
// to Commit, which indexes the parts and checks that they tile each
// tensor. Each tensor must be saved once: a replicated tensor is saved by
// TP rank 0 only, so WriteParts leaves out the replicated parts of other
// TP ranks (Part.Rank ≠ 0) and a rank may pass all it holds
// (model.Stage.Shards); which DP ranks save what is the caller's choice,
// as with WriteShard. A part written whole keeps the part's shape in the
// file; a range of one is stored 1-D.
func WriteParts(root string, step int64, rank int, parts []PartTensor, state []byte) (File, error) {
	fail := func(err error) (File, error) {
		return File{}, fmt.Errorf("ckpt: write %s/%s: %w", StepDirName(step), RankFileName(rank), err)
	}
	if step < 0 || rank < 0 {
		return fail(fmt.Errorf("step %d, rank %d: must not be negative", step, rank))
	}
	tensors, refs, shapes, err := planParts(parts)
	if err != nil {
		return fail(err)
	}
	entries, meta, err := planShard(step, rank, tensors, state)
	if err != nil {
		return fail(err)
	}
	for i, s := range shapes {
		if s != nil {
			entries[i].Shape = s
		}
	}
	if len(refs) > 0 {
		js, err := json.Marshal(refs)
		if err != nil {
			return fail(err)
		}
		meta[metaParts] = string(js)
	}
	file, err := writeRankFile(root, step, rank, entries, meta, tensors)
	if err != nil {
		return fail(err)
	}
	return file, nil
}

// planParts checks parts against their shapes and returns what to write:
// the tensors (Offset within the part), the parts by name, and per tensor
// the part's shape when it is written whole (else nil). Replicated parts of
// TP ranks other than 0 are left out.
func planParts(parts []PartTensor) ([]Tensor, map[string]PartRef, [][]int, error) {
	var tensors []Tensor
	var shapes [][]int
	refs := map[string]PartRef{}
	for _, pt := range parts {
		p := pt.Part
		if p.Split == tensorpar.Replicated && p.Rank != 0 {
			continue
		}
		t := Tensor{Name: pt.Name, Shape: pt.Shape, Offset: pt.Offset, Data: pt.Data}
		if isWhole(p) {
			tensors, shapes = append(tensors, t), append(shapes, nil)
			continue
		}
		ps, err := p.Shape(pt.Shape)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tensor %q: %w", pt.Name, err)
		}
		n, err := numelOf(ps, maxElems)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tensor %q: %w", pt.Name, err)
		}
		if pt.Offset < 0 || pt.Offset > n || len(pt.Data) > n-pt.Offset {
			return nil, nil, nil, fmt.Errorf("tensor %q: %d elements at offset %d do not fit %v of shape %v", pt.Name, len(pt.Data), pt.Offset, partRefOf(p), ps)
		}
		var shape []int
		if pt.Offset == 0 && len(pt.Data) == n {
			shape = ps
		}
		refs[pt.Name] = partRefOf(p)
		tensors, shapes = append(tensors, t), append(shapes, shape)
	}
	return tensors, refs, shapes, nil
}

// readPartsMeta decodes and checks the parts a rank file's metadata
// lists: each of a tensor of the file, and a valid part.
func readPartsMeta(h *Header, rm rankMeta) (map[string]PartRef, error) {
	js, ok := h.Metadata[metaParts]
	if !ok {
		return nil, nil
	}
	var refs map[string]PartRef
	if err := json.Unmarshal([]byte(js), &refs); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", metaParts, err)
	}
	for name, r := range refs {
		if _, ok := rm.shards[name]; !ok {
			return nil, fmt.Errorf("metadata %s: tensor %q is not in the file", metaParts, name)
		}
		if r.IsZero() {
			return nil, fmt.Errorf("metadata %s: tensor %q: an empty part", metaParts, name)
		}
		if _, err := r.part(); err != nil {
			return nil, fmt.Errorf("metadata %s: tensor %q: %w", metaParts, name, err)
		}
	}
	return refs, nil
}

// Parts returns what rank wrote with WriteParts (or WriteShard): its
// tensors, each with its full shape, its part (a replicated Part of size 1
// for a whole tensor) and its offset in the part, in the order they were
// written, and its state bytes. Use it to resume with the layout that
// wrote the checkpoint.
func (c *Checkpoint) Parts(rank int) ([]PartTensor, []byte, error) {
	tensors, state, refs, err := c.readRank(rank)
	if err != nil {
		return nil, nil, err
	}
	out := make([]PartTensor, len(tensors))
	for i, t := range tensors {
		p, err := refs[t.Name].part()
		if err != nil { // readRank checked them
			return nil, nil, fmt.Errorf("ckpt: read %s: rank %d: tensor %q: %w", filepath.Base(c.Dir), rank, t.Name, err)
		}
		out[i] = PartTensor{Name: t.Name, Shape: t.Shape, Part: p, Offset: t.Offset, Data: t.Data}
	}
	return out, state, nil
}
