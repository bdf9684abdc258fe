package ckpt

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/tensorpar"
)

// ReadRange reads elements [offset, offset+len(dst)) of the flattened full
// tensor name into dst, whatever layout wrote the checkpoint (ranges of
// ZeRO and DP, tensor-parallel parts, or both): what a DP or ZeRO rank
// loads. It reads only the shards that hold the range, a chunk at a time.
func (c *Checkpoint) ReadRange(name string, offset int, dst []float32) error {
	return c.ReadPartRange(name, tensorpar.Part{Split: tensorpar.Replicated, Size: 1}, offset, dst)
}

// ReadPart returns part p of the full tensor name, as p.Extract would cut
// it from the full tensor, and the part's shape, whatever layout wrote the
// checkpoint: what a tensor-parallel rank of any TP size loads. A
// replicated p is the whole tensor.
func (c *Checkpoint) ReadPart(name string, p tensorpar.Part) ([]float32, []int, error) {
	t, err := c.index(name)
	if err != nil {
		return nil, nil, err
	}
	shape := slices.Clone(t.Shape)
	if !isWhole(p) {
		if shape, err = p.Shape(t.Shape); err != nil {
			return nil, nil, fmt.Errorf("ckpt: read %s: tensor %q: %w", filepath.Base(c.Dir), name, err)
		}
	}
	// The index tiles the tensor with shards the files hold, so the part
	// is no larger than the files.
	n, err := numelOf(shape, maxElems)
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: read %s: tensor %q: %w", filepath.Base(c.Dir), name, err)
	}
	out := make([]float32, n)
	if err := c.ReadPartRange(name, p, 0, out); err != nil {
		return nil, nil, err
	}
	return out, shape, nil
}

// ReadPartRange reads elements [offset, offset+len(dst)) of part p of the
// full tensor name (flattened in the part's shape) into dst: a ZeRO rank's
// share of a tensor-parallel part (Megatron's distributed optimizer). A
// replicated p is the whole tensor.
func (c *Checkpoint) ReadPartRange(name string, p tensorpar.Part, offset int, dst []float32) error {
	r, err := c.newTensorReader(name)
	if err != nil {
		return err
	}
	defer r.close()
	want, err := pieceOf(p, r.shape, offset, len(dst))
	if err != nil {
		return r.fail(err)
	}
	return r.read(want, dst)
}

// hasParts reports whether some shard of t is a tensor-parallel part.
func (t *TensorIndex) hasParts() bool { return slices.ContainsFunc(t.Shards, hasPart) }

// runs say where a part's elements lie in the flattened full tensor: count
// runs of k elements each, run i holding the part's elements [i·k,
// (i+1)·k) from full offset start(i), which grows with i. They mirror
// engine/tensorpar's Part (TestRunsMatchExtract holds them to it).
type runs struct {
	count, k int
	lo       int // the full offset of run 0
	stride   int // full elements per row
	third    int // qkv-heads: the width of each of q, k and v; else 0
}

// start is the full offset of run i.
func (g runs) start(i int) int {
	if g.third > 0 {
		return i/3*g.stride + i%3*g.third + g.lo
	}
	return i*g.stride + g.lo
}

// runsOf are the runs of part p of a tensor of shape.
func runsOf(p tensorpar.Part, shape []int) (runs, error) {
	numel, err := numelOf(shape, maxElems)
	if err != nil {
		return runs{}, err
	}
	if isWhole(p) {
		return runs{count: 1, k: numel}, nil
	}
	if _, err := p.Shape(shape); err != nil { // checks p against shape
		return runs{}, err
	}
	w := shape[len(shape)-1]
	switch p.Split {
	case tensorpar.Rows:
		row := numel / shape[0]
		lo, hi := comm.Block(shape[0], p.Rank, p.Size)
		return runs{count: 1, k: (hi - lo) * row, lo: lo * row}, nil
	case tensorpar.Columns:
		lo, hi := comm.Block(w, p.Rank, p.Size)
		return runs{count: numel / w, k: hi - lo, lo: lo, stride: w}, nil
	case tensorpar.QKVHeads:
		lo, hi := comm.Block(w/3, p.Rank, p.Size)
		return runs{count: 3 * (numel / w), k: hi - lo, lo: lo, stride: w, third: w / 3}, nil
	}
	return runs{}, fmt.Errorf("unknown split %v", p.Split)
}

// piece is the elements [lo, hi) of a part, as runs of the full tensor.
type piece struct {
	runs
	lo, hi int
}

// pieceOf is elements [offset, offset+n) of part p of a tensor of shape.
func pieceOf(p tensorpar.Part, shape []int, offset, n int) (piece, error) {
	g, err := runsOf(p, shape)
	if err != nil {
		return piece{}, err
	}
	if total := g.count * g.k; offset < 0 || n < 0 || offset > total || n > total-offset {
		return piece{}, fmt.Errorf("elements [%d, +%d) are outside the %d of %v", offset, n, total, partRefOf(p))
	}
	return piece{runs: g, lo: offset, hi: offset + n}, nil
}

// segment is the part of run i inside the piece: full elements [a, b),
// the first of them element pa of the part.
func (q piece) segment(i int) (a, b, pa int) {
	pa, pe := max(i*q.k, q.lo), min(i*q.k+q.k, q.hi)
	a = q.start(i) + pa - i*q.k
	return a, a + pe - pa, pa
}

// overlaps calls f(s, d, n) for each run of n full-tensor elements that
// both src and dst hold, at element s of src and d of dst (counted from
// their lo), in increasing s.
func overlaps(src, dst piece, f func(s, d, n int) error) error {
	if src.hi <= src.lo || dst.hi <= dst.lo {
		return nil
	}
	si0, si1 := src.lo/src.k, (src.hi-1)/src.k
	dj0, dj1 := dst.lo/dst.k, (dst.hi-1)/dst.k
	first, _, _ := dst.segment(dj0)
	_, last, _ := dst.segment(dj1)
	// Skip the source runs that end before dst begins.
	si0 += sort.Search(si1+1-si0, func(i int) bool { return src.start(si0+i)+src.k > first })
	j := dj0
	for i := si0; i <= si1; i++ {
		a, b, pa := src.segment(i)
		if a >= last {
			break
		}
		for ; j <= dj1; j++ {
			if _, d, _ := dst.segment(j); d > a {
				break
			}
		}
		for k := j; k <= dj1; k++ {
			c, d, pc := dst.segment(k)
			if c >= b {
				break
			}
			if x, y := max(a, c), min(b, d); x < y {
				if err := f(pa+x-a-src.lo, pc+x-c-dst.lo, y-x); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// tensorReader assembles pieces of one tensor from its shards, keeping a
// window of up to a chunk of each shard it reads from, so reading a tensor
// a chunk at a time (Export) reads each shard once.
type tensorReader struct {
	c     *Checkpoint
	name  string
	shape []int
	srcs  []source
	raw   []byte
}

// source is one shard: its piece of the tensor, its file, where its data
// start, and the window of it last read.
type source struct {
	piece
	file     string
	base     int64
	f        *os.File
	win      []float32
	winStart int // element of the shard at win[0]
}

// newTensorReader prepares to read tensor name, checking that each shard's
// entry in its verified file holds the index's number of F32 elements.
func (c *Checkpoint) newTensorReader(name string) (*tensorReader, error) {
	t, err := c.index(name)
	if err != nil {
		return nil, err
	}
	r := &tensorReader{c: c, name: name, shape: t.Shape}
	for _, s := range t.Shards {
		p, err := s.Part.part()
		if err != nil {
			return nil, r.fail(err)
		}
		q, err := pieceOf(p, t.Shape, s.Offset, s.Len)
		if err != nil {
			return nil, r.fail(fmt.Errorf("shard in %s: %w", s.File, err))
		}
		h, e, err := c.entry(s.File, name)
		if err != nil {
			return nil, r.fail(fmt.Errorf("%s: %w", s.File, err))
		}
		if e.DType != "F32" || e.Numel() != s.Len {
			return nil, r.fail(fmt.Errorf("%s holds %d %s elements, the index %d F32", s.File, e.Numel(), e.DType, s.Len))
		}
		r.srcs = append(r.srcs, source{piece: q, file: s.File, base: h.DataStart + e.Begin})
	}
	return r, nil
}

func (r *tensorReader) fail(err error) error {
	return fmt.Errorf("ckpt: read %s: tensor %q: %w", filepath.Base(r.c.Dir), r.name, err)
}

// close closes the files the reader opened.
func (r *tensorReader) close() {
	for i := range r.srcs {
		if f := r.srcs[i].f; f != nil {
			f.Close()
			r.srcs[i].f = nil
		}
	}
}

// read fills dst with piece want, checking that the shards held all of it.
func (r *tensorReader) read(want piece, dst []float32) error {
	if len(dst) != want.hi-want.lo {
		return r.fail(fmt.Errorf("%d elements asked into %d", want.hi-want.lo, len(dst)))
	}
	got := 0
	for i := range r.srcs {
		src := &r.srcs[i]
		err := overlaps(src.piece, want, func(s, d, n int) error {
			got += n
			return r.copyFrom(src, s, dst[d:d+n])
		})
		if err != nil {
			return r.fail(fmt.Errorf("%s: %w", src.file, err))
		}
	}
	if got != len(dst) {
		return r.fail(fmt.Errorf("the shards hold %d of the %d elements asked for", got, len(dst)))
	}
	return nil
}

// copyFrom copies elements [pos, pos+len(dst)) of src's shard into dst,
// through src's window, or straight into dst for a chunk or more.
func (r *tensorReader) copyFrom(src *source, pos int, dst []float32) error {
	if src.f == nil {
		f, err := os.Open(filepath.Join(r.c.Dir, src.file))
		if err != nil {
			return err
		}
		src.f = f
	}
	if len(dst) >= chunkElems {
		return r.readAt(src, pos, dst)
	}
	for len(dst) > 0 {
		if pos < src.winStart || pos >= src.winStart+len(src.win) {
			n := min(chunkElems, src.hi-src.lo-pos)
			if cap(src.win) < n {
				src.win = make([]float32, n)
			}
			src.win, src.winStart = src.win[:n], pos
			if err := r.readAt(src, pos, src.win); err != nil {
				src.win = src.win[:0]
				return err
			}
		}
		n := copy(dst, src.win[pos-src.winStart:])
		dst, pos = dst[n:], pos+n
	}
	return nil
}

// readAt reads elements [pos, pos+len(dst)) of src's shard into dst, a
// chunk at a time through one reused buffer.
func (r *tensorReader) readAt(src *source, pos int, dst []float32) error {
	for len(dst) > 0 {
		n := min(len(dst), chunkElems)
		if cap(r.raw) < 4*n {
			r.raw = make([]byte, 4*min(chunkElems, max(n, len(dst))))
		}
		b := r.raw[:4*n]
		if _, err := src.f.ReadAt(b, src.base+4*int64(pos)); err != nil {
			return err
		}
		for i := range n {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		dst, pos = dst[n:], pos+n
	}
	return nil
}

// copyParts writes the full tensor t, held as tensor-parallel parts, to w
// as dtype: a chunk of the full tensor at a time, each assembled from the
// parts, until ctx ends: then it returns ctx's cause.
func (c *Checkpoint) copyParts(ctx context.Context, w io.Writer, t *TensorIndex, dtype comm.DType) error {
	r, err := c.newTensorReader(t.Name)
	if err != nil {
		return err
	}
	defer r.close()
	whole := tensorpar.Part{Split: tensorpar.Replicated, Size: 1}
	numel := sumLens(t.Shards) // they tile the tensor: Open checked
	floats := make([]float32, min(numel, chunkElems))
	var halves []uint16 // the 16-bit encodings, before their bytes
	if dtype.Size() == 2 {
		halves = make([]uint16, len(floats))
	}
	var enc []byte
	for off := 0; off < numel; {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		n := min(numel-off, chunkElems)
		want, err := pieceOf(whole, t.Shape, off, n)
		if err != nil {
			return r.fail(err)
		}
		if err := r.read(want, floats[:n]); err != nil {
			return err
		}
		if testHookChunk != nil {
			testHookChunk()
		}
		enc = encodeAs(enc[:0], halves, floats[:n], dtype)
		if _, err := w.Write(enc); err != nil {
			return err
		}
		off += n
	}
	return nil
}
