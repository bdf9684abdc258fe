package ckpt

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/usage"
)

// ExportOptions choose what Export writes.
type ExportOptions struct {
	// DType is the element type of the exported tensors: comm.Float32 (the
	// default, also for the zero DType), comm.BFloat16 or comm.Float16.
	// Narrow types round as engine/comm's conversions do: to nearest, ties to
	// even, as PyTorch's .to() does.
	DType comm.DType
	// Optimizer exports the optimizer state too (the tensors named
	// OptimizerPrefix + ...); by default only the model parameters.
	Optimizer bool
}

// Exported describes the file an export wrote.
type Exported struct {
	Checkpoint string `json:"checkpoint"` // the step directory exported
	Step       int64  `json:"step"`
	Path       string `json:"path"` // the safetensors file written
	Tensors    int    `json:"tensors"`
	Elements   int64  `json:"elements"`
	Bytes      int64  `json:"bytes"` // the file's size
	DType      string `json:"dtype"` // the safetensors name of its element type: F32, BF16 or F16
}

// safetensorsDType is the safetensors name of dt; the zero DType is F32.
func safetensorsDType(dt comm.DType) (string, error) {
	switch dt {
	case 0, comm.Float32:
		return "F32", nil
	case comm.BFloat16:
		return "BF16", nil
	case comm.Float16:
		return "F16", nil
	}
	return "", fmt.Errorf("%v: want f32, bf16 or f16", dt)
}

// Export writes the full tensors of checkpoint c to one safetensors file
// out, readable by the safetensors/PyTorch ecosystem (metadata "format":
// "pt"), under the names the engine gave them. It streams shard by shard,
// never holding a whole tensor, and replaces out atomically. When ctx ends
// it stops within a MiB, with an error wrapping ctx's cause, and leaves out
// as it was and no temporary file.
func Export(ctx context.Context, c *Checkpoint, out string, opts ExportOptions) error {
	_, err := export(ctx, c, out, opts)
	return err
}

// export is Export, saying what it wrote.
func export(ctx context.Context, c *Checkpoint, out string, opts ExportOptions) (Exported, error) {
	fail := func(err error) (Exported, error) {
		return Exported{}, fmt.Errorf("ckpt: export %s to %s: %w", filepath.Base(c.Dir), out, err)
	}
	dtype, err := safetensorsDType(opts.DType)
	if err != nil {
		return fail(err)
	}
	res := Exported{Checkpoint: c.Dir, Step: c.Step(), Path: out, DType: dtype}
	var sel []TensorIndex
	for _, t := range c.Manifest.Tensors {
		if opts.Optimizer || !strings.HasPrefix(t.Name, OptimizerPrefix) {
			sel = append(sel, t)
		}
	}
	if len(sel) == 0 {
		return fail(errors.New("no tensors to export (only optimizer state? add the optimizer option)"))
	}
	entries := make([]Entry, len(sel))
	for i, t := range sel {
		entries[i] = Entry{Name: t.Name, DType: dtype, Shape: t.Shape}
		res.Elements += int64(sumLens(t.Shards))
	}
	data := layoutEntries(entries, func(i int) int { return sumLens(sel[i].Shards) })
	header, err := encodeHeader(entries, map[string]string{"format": "pt", "gtrain.step": strconv.FormatInt(c.Step(), 10)})
	if err != nil {
		return fail(err)
	}
	res.Tensors, res.Bytes = len(sel), int64(len(header))+data
	if ctx.Err() != nil { // before the temporary file is created
		return fail(context.Cause(ctx))
	}
	err = writeAtomic(out, func(f io.Writer) error {
		w := bufio.NewWriterSize(f, 1<<20)
		if _, err := w.Write(header); err != nil {
			return err
		}
		for _, t := range sel {
			if t.hasParts() {
				if err := c.copyParts(ctx, w, &t, opts.DType); err != nil {
					return err
				}
				continue
			}
			for _, s := range t.Shards { // in offset order, tiling the tensor
				if err := c.copyEntry(ctx, w, s, t.Name, opts.DType); err != nil {
					return err
				}
			}
		}
		return w.Flush()
	})
	if err != nil {
		return fail(err)
	}
	return res, nil
}

func sumLens(shards []ShardRef) int {
	n := 0
	for _, s := range shards {
		n += s.Len
	}
	return n
}

// copyEntry writes shard s of tensor name to w as dtype, a chunk at a time,
// until ctx ends: then it returns ctx's cause.
func (c *Checkpoint) copyEntry(ctx context.Context, w io.Writer, s ShardRef, name string, dtype comm.DType) error {
	fail := func(err error) error { return fmt.Errorf("read %s: tensor %q: %w", s.File, name, err) }
	h, e, err := c.entry(s.File, name)
	if err != nil {
		return fail(err)
	}
	if e.DType != "F32" || e.Numel() != s.Len {
		return fail(fmt.Errorf("holds %d %s elements, want %d F32", e.Numel(), e.DType, s.Len))
	}
	f, err := os.Open(filepath.Join(c.Dir, s.File))
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	floats := make([]float32, min(s.Len, chunkElems))
	var halves []uint16 // the 16-bit encodings, before their bytes
	if dtype.Size() == 2 {
		halves = make([]uint16, len(floats))
	}
	var enc []byte
	for off, left := h.DataStart+e.Begin, s.Len; left > 0; {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		n := min(left, chunkElems)
		if err := readF32At(f, off, floats[:n]); err != nil {
			return fail(err)
		}
		if testHookChunk != nil {
			testHookChunk()
		}
		enc = encodeAs(enc[:0], halves, floats[:n], dtype)
		if _, err := w.Write(enc); err != nil {
			return err
		}
		off, left = off+4*int64(n), left-n
	}
	return nil
}

// encodeAs appends src to dst as little-endian F32, BF16 or F16, rounded by
// engine/comm's conversions (the collectives' own, tested against the IEEE
// rules); halves is scratch of at least len(src) for the 16-bit types.
func encodeAs(dst []byte, halves []uint16, src []float32, dtype comm.DType) []byte {
	switch dtype {
	case comm.BFloat16:
		comm.EncodeBF16(halves, src)
	case comm.Float16:
		comm.EncodeF16(halves, src)
	default:
		return f32Bytes(dst, src)
	}
	for _, h := range halves[:len(src)] {
		dst = binary.LittleEndian.AppendUint16(dst, h)
	}
	return dst
}

// ExportRequest is an export of a checkpoint the user named to a command.
type ExportRequest struct {
	Op   string // the command, first in its errors: "ckpt export"
	From string // a step directory, or a root: its newest valid checkpoint
	To   string // the safetensors file to write
	ExportOptions
	Warn func(string) // hears of the newer, invalid checkpoints of a root passed over; may be nil
}

// ExportPath finds, verifies and exports (see Export) the checkpoint r
// names, and says what it wrote. A destination that is no regular file is
// refused before the checkpoint is read, which can take minutes, and a From
// that is no directory too, both as usage errors. When ctx ends, the error
// is ctx's cause alone, and nothing is written.
func ExportPath(ctx context.Context, r ExportRequest) (Exported, error) {
	var nr *atomicfile.NotRegularError
	if _, err := atomicfile.Resolve(r.To); errors.As(err, &nr) {
		return Exported{}, usage.Errorf("%s: %v", r.Op, err)
	}
	target, err := ResolveArg(r.Op, r.From)
	if err != nil {
		return Exported{}, err
	}
	c, err := target.Load(ctx, r.Warn)
	var inv *InvalidError
	switch {
	case err != nil && ctx.Err() != nil:
		return Exported{}, context.Cause(ctx)
	case errors.As(err, &inv):
		return Exported{}, fmt.Errorf("%s: %w; %s", r.Op, err, invalidHint)
	case err != nil:
		return Exported{}, fmt.Errorf("%s: %w", r.Op, err)
	}
	res, err := export(ctx, c, r.To, r.ExportOptions)
	if err != nil {
		return Exported{}, interruptedOr(ctx, err)
	}
	return res, nil
}
