package ckpt

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ExportOptions choose what Export writes.
type ExportOptions struct {
	// DType is the element type of the exported tensors: "F32" (the
	// default), "BF16" or "F16", in any spelling ParseDType accepts. Narrow
	// types round to nearest, ties to even, as PyTorch's .to() does.
	DType string
	// Optimizer exports the optimizer state too (the tensors named
	// OptimizerPrefix + ...); by default only the model parameters.
	Optimizer bool
}

// ParseDType returns the safetensors name (F32, BF16 or F16) of an export
// element type: f32, float32, fp32, bf16, bfloat16, f16, float16, fp16 or
// half, in any case; "" is F32.
func ParseDType(s string) (string, error) {
	switch strings.ToLower(s) {
	case "", "f32", "float32", "fp32":
		return "F32", nil
	case "bf16", "bfloat16":
		return "BF16", nil
	case "f16", "float16", "fp16", "half":
		return "F16", nil
	}
	return "", fmt.Errorf("dtype %q: want f32, bf16 or f16", s)
}

// Export writes the full tensors of checkpoint c to one safetensors file
// out, readable by the safetensors/PyTorch ecosystem (metadata "format":
// "pt"), under the names the engine gave them. It streams shard by shard,
// never holding a whole tensor, and replaces out atomically. When ctx ends
// it stops within a MiB, with an error wrapping ctx's cause, and leaves out
// as it was and no temporary file.
func Export(ctx context.Context, c *Checkpoint, out string, opts ExportOptions) error {
	fail := func(err error) error {
		return fmt.Errorf("ckpt: export %s to %s: %w", filepath.Base(c.Dir), out, err)
	}
	dtype, err := ParseDType(opts.DType)
	if err != nil {
		return fail(err)
	}
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
	}
	layoutEntries(entries, func(i int) int { return sumLens(sel[i].Shards) })
	header, err := encodeHeader(entries, map[string]string{"format": "pt", "gtrain.step": strconv.FormatInt(c.Step(), 10)})
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil { // before the temporary file is created
		return fail(context.Cause(ctx))
	}
	err = writeAtomic(out, func(f io.Writer) error {
		w := bufio.NewWriterSize(f, 1<<20)
		if _, err := w.Write(header); err != nil {
			return err
		}
		for _, t := range sel {
			for _, s := range t.Shards { // in offset order, tiling the tensor
				if err := c.copyEntry(ctx, w, s, t.Name, dtype); err != nil {
					return err
				}
			}
		}
		return w.Flush()
	})
	if err != nil {
		return fail(err)
	}
	return nil
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
func (c *Checkpoint) copyEntry(ctx context.Context, w io.Writer, s ShardRef, name, dtype string) error {
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
		enc = encodeAs(enc[:0], floats[:n], dtype)
		if _, err := w.Write(enc); err != nil {
			return err
		}
		off, left = off+4*int64(n), left-n
	}
	return nil
}

// encodeAs appends src to dst as little-endian F32, BF16 or F16.
func encodeAs(dst []byte, src []float32, dtype string) []byte {
	switch dtype {
	case "BF16":
		for _, f := range src {
			dst = binary.LittleEndian.AppendUint16(dst, bf16FromF32(f))
		}
	case "F16":
		for _, f := range src {
			dst = binary.LittleEndian.AppendUint16(dst, f16FromF32(f))
		}
	default:
		dst = f32Bytes(dst, src)
	}
	return dst
}

// The conversions round to nearest, ties to even, keep NaN a (quiet) NaN
// and overflow to ±Inf, as IEEE 754 and PyTorch do. They are engine/comm's
// scalar ones, repeated so that checkpoints do not depend on the collective
// library; a test checks that the two agree.

// bf16FromF32 rounds f to the nearest bfloat16.
func bf16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: rounding could carry it into Inf
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds the dropped half to
	// nearest-even; a carry propagates into the exponent (up to Inf).
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// f16FromF32 rounds f to the nearest IEEE binary16.
func f16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	e, man := b>>23&0xff, b&0x7fffff
	switch {
	case e-113 < 30: // a normal float16, or rounds up to Inf
		a := b&0x7fffffff - 112<<23 // rebias the exponent from 127 to 15
		return sign | uint16((a+0xfff+(a>>13)&1)>>13)
	case e == 0xff && man != 0: // NaN
		return sign | 0x7e00 | uint16(man>>13)
	case e >= 143: // Inf, or |f| >= 2^16
		return sign | 0x7c00
	case e < 102: // |f| < 2^-25, half the smallest subnormal: ±0
		return sign
	}
	// |f| in [2^-25, 2^-14): a subnormal, in units of 2^-24.
	m := man | 0x800000
	shift := 126 - e
	r := m >> shift
	rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
	if rem > half || rem == half && r&1 == 1 {
		r++ // may become 0x400, the smallest normal: still the right encoding
	}
	return sign | uint16(r)
}
