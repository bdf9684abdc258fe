package ckpt

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/gtrain/gtrain/engine/tensorpar"
)

// Checkpoint is a verified checkpoint, as Open and Latest return it. Its
// methods are safe for concurrent use.
type Checkpoint struct {
	Dir      string // the step directory
	Manifest Manifest
	headers  map[string]*Header // by file name, read when it was verified
}

// Step is the step the checkpoint was taken at.
func (c *Checkpoint) Step() int64 { return c.Manifest.Step }

// index returns the manifest's entry of the tensor called name.
func (c *Checkpoint) index(name string) (*TensorIndex, error) {
	ts := c.Manifest.Tensors
	i, ok := slices.BinarySearchFunc(ts, name, func(t TensorIndex, n string) int {
		switch {
		case t.Name < n:
			return -1
		case t.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		return nil, fmt.Errorf("ckpt: %s: no tensor %q", filepath.Base(c.Dir), name)
	}
	return &ts[i], nil
}

// Tensor returns the full tensor called name, assembled from its shards,
// and its shape. Use it to load a checkpoint into another layout than the
// one that wrote it.
func (c *Checkpoint) Tensor(name string) ([]float32, []int, error) {
	t, err := c.index(name)
	if err != nil {
		return nil, nil, err
	}
	if t.hasParts() {
		return c.ReadPart(name, tensorpar.Part{Split: tensorpar.Replicated, Size: 1})
	}
	// Open checked that the shards tile the shape and that the files hold
	// them, so the size is bounded by the files'.
	numel, err := numelOf(t.Shape, math.MaxInt64/8)
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: %s: tensor %q: %w", filepath.Base(c.Dir), name, err)
	}
	out := make([]float32, numel)
	for _, s := range t.Shards {
		if s.Offset < 0 || s.Len < 0 || s.Offset > numel-s.Len {
			return nil, nil, fmt.Errorf("ckpt: %s: tensor %q: shard [%d, +%d) outside %d elements", filepath.Base(c.Dir), name, s.Offset, s.Len, numel)
		}
		if err := c.readEntry(s.File, name, out[s.Offset:s.Offset+s.Len]); err != nil {
			return nil, nil, err
		}
	}
	return out, slices.Clone(t.Shape), nil
}

// readEntry reads the F32 tensor name of file into dst, whose length must
// be the entry's.
func (c *Checkpoint) readEntry(file, name string, dst []float32) error {
	fail := func(err error) error {
		return fmt.Errorf("ckpt: read %s/%s: tensor %q: %w", filepath.Base(c.Dir), file, name, err)
	}
	h, e, err := c.entry(file, name)
	if err != nil {
		return fail(err)
	}
	if e.DType != "F32" || e.Numel() != len(dst) {
		return fail(fmt.Errorf("holds %d %s elements, want %d F32", e.Numel(), e.DType, len(dst)))
	}
	f, err := os.Open(filepath.Join(c.Dir, file))
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if err := readF32At(f, h.DataStart+e.Begin, dst); err != nil {
		return fail(err)
	}
	return nil
}

// entry looks up a tensor in the header of file.
func (c *Checkpoint) entry(file, name string) (*Header, Entry, error) {
	h := c.headers[file]
	if h == nil {
		return nil, Entry{}, fmt.Errorf("not a verified file of the checkpoint (use Open or Latest)")
	}
	e, ok := h.Entry(name)
	if !ok {
		return nil, Entry{}, fmt.Errorf("not in the file")
	}
	return h, e, nil
}

// Shard returns what rank wrote with WriteShard: its tensors (each with the
// full shape and its offset), in the order they were written, and its
// state bytes. Use it to resume with the layout that wrote the checkpoint.
// A file of tensor-parallel parts (WriteParts) is refused: Parts reads it.
func (c *Checkpoint) Shard(rank int) ([]Tensor, []byte, error) {
	tensors, state, parts, err := c.readRank(rank)
	if err == nil && len(parts) > 0 {
		return nil, nil, fmt.Errorf("ckpt: read %s: the file of rank %d holds tensor-parallel parts: read it with Parts", filepath.Base(c.Dir), rank)
	}
	return tensors, state, err
}

// readRank reads rank's file: its tensors (the offsets within their parts,
// if any), state, and parts by tensor name.
func (c *Checkpoint) readRank(rank int) ([]Tensor, []byte, map[string]PartRef, error) {
	name, h, rm, err := c.rankFile(rank)
	if err != nil {
		return nil, nil, nil, err
	}
	fail := func(err error) ([]Tensor, []byte, map[string]PartRef, error) {
		return nil, nil, nil, fmt.Errorf("ckpt: read %s/%s: %w", filepath.Base(c.Dir), name, err)
	}
	parts, err := readPartsMeta(h, rm)
	if err != nil {
		return fail(err)
	}
	f, err := os.Open(filepath.Join(c.Dir, name))
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	tensors := make([]Tensor, len(h.Entries))
	for j, e := range h.Entries {
		if e.DType != "F32" {
			return fail(fmt.Errorf("tensor %q: dtype %s, want F32", e.Name, e.DType))
		}
		sm := rm.shards[e.Name]
		tensors[j] = Tensor{Name: e.Name, Shape: sm.Shape, Offset: sm.Offset, Data: make([]float32, e.Numel())}
		if err := readF32At(f, h.DataStart+e.Begin, tensors[j].Data); err != nil {
			return fail(fmt.Errorf("tensor %q: %w", e.Name, err))
		}
	}
	return tensors, rm.state, parts, nil
}

// State returns the state bytes rank wrote with WriteShard, without
// reading its tensors.
func (c *Checkpoint) State(rank int) ([]byte, error) {
	_, _, rm, err := c.rankFile(rank)
	return rm.state, err
}

// rankFile finds rank's file, its verified header and its metadata.
func (c *Checkpoint) rankFile(rank int) (string, *Header, rankMeta, error) {
	i := slices.IndexFunc(c.Manifest.Files, func(f File) bool { return f.Rank == rank })
	if i < 0 {
		return "", nil, rankMeta{}, fmt.Errorf("ckpt: %s: no file of rank %d (the checkpoint has %d files; layout %+v)", filepath.Base(c.Dir), rank, len(c.Manifest.Files), c.Manifest.Layout)
	}
	name := c.Manifest.Files[i].Name
	h := c.headers[name]
	if h == nil {
		return name, nil, rankMeta{}, fmt.Errorf("ckpt: read %s/%s: not a verified file of the checkpoint (use Open or Latest)", filepath.Base(c.Dir), name)
	}
	rm, err := readRankMeta(h)
	if err != nil {
		return name, nil, rankMeta{}, fmt.Errorf("ckpt: read %s/%s: %w", filepath.Base(c.Dir), name, err)
	}
	return name, h, rm, nil
}

// readF32At reads len(dst) little-endian float32s at off, a chunk at a
// time.
func readF32At(r io.ReaderAt, off int64, dst []float32) error {
	buf := make([]byte, 4*min(len(dst), chunkElems))
	for len(dst) > 0 {
		n := min(len(dst), chunkElems)
		b := buf[:4*n]
		if _, err := r.ReadAt(b, off); err != nil {
			return err
		}
		for i := range n {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		dst, off = dst[n:], off+int64(4*n)
	}
	return nil
}
