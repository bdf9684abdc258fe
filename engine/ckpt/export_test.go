package ckpt

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
)

// exported is one tensor of an exported file, its elements as raw bits.
type exported struct {
	dtype string
	shape []int
	bits  []uint32 // F32 bits, or the 16-bit values of BF16/F16
}

// readExport reads an exported file with ReadHeader.
func readExport(t *testing.T, path string) (map[string]exported, map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	h := headerOf(t, path)
	out := map[string]exported{}
	for _, e := range h.Entries {
		data := b[h.DataStart+e.Begin : h.DataStart+e.End]
		x := exported{dtype: e.DType, shape: e.Shape}
		for i := range e.Numel() {
			if e.DType == "F32" {
				x.bits = append(x.bits, binary.LittleEndian.Uint32(data[4*i:]))
			} else {
				x.bits = append(x.bits, uint32(binary.LittleEndian.Uint16(data[2*i:])))
			}
		}
		out[e.Name] = x
	}
	return out, h.Metadata
}

// wantBits is t's elements as dtype would store them, rounded by
// engine/comm's scalar conversions (the export uses its slice forms).
func wantBits(data []float32, dtype string) []uint32 {
	out := make([]uint32, len(data))
	for i, f := range data {
		switch dtype {
		case "BF16":
			out[i] = uint32(comm.BF16FromFloat32(f))
		case "F16":
			out[i] = uint32(comm.F16FromFloat32(f))
		default:
			out[i] = math.Float32bits(f)
		}
	}
	return out
}

// TestExport writes a three-rank checkpoint as one file of full tensors in
// each dtype, with and without the optimizer state, and reads it back.
func TestExport(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 42, 3, 0)
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	for dt, want := range map[comm.DType]string{0: "F32", comm.Float32: "F32", comm.BFloat16: "BF16", comm.Float16: "F16"} {
		dtype := dt.String()
		for _, opt := range []bool{false, true} {
			out := filepath.Join(t.TempDir(), "model.safetensors")
			if err := Export(t.Context(), c, out, ExportOptions{DType: dt, Optimizer: opt}); err != nil {
				t.Fatal(err)
			}
			got, meta := readExport(t, out)
			if meta["format"] != "pt" || meta["gtrain.step"] != "42" {
				t.Errorf("%s: metadata %v", dtype, meta)
			}
			n := 0
			for _, full := range fullTensors(42, 1) {
				isOpt := strings.HasPrefix(full.Name, OptimizerPrefix)
				x, ok := got[full.Name]
				if ok != (opt || !isOpt) {
					t.Errorf("%s optimizer=%v: tensor %s exported: %v", dtype, opt, full.Name, ok)
					continue
				}
				if ok {
					n++
					if x.dtype != want || !slices.Equal(x.shape, full.Shape) || !slices.Equal(x.bits, wantBits(full.Data, want)) {
						t.Errorf("%s: tensor %s: %s %v, want %s %v and the converted data", dtype, full.Name, x.dtype, x.shape, want, full.Shape)
					}
				}
			}
			if n != len(got) {
				t.Errorf("%s: %d tensors exported, want %d", dtype, len(got), n)
			}
		}
	}
}

// TestExportRefuses: a bad dtype, nothing to export, or an unwritable
// destination fail and leave nothing behind.
func TestExportRefuses(t *testing.T) {
	root := t.TempDir()
	f, err := WriteShard(root, 1, 0, []Tensor{{Name: "optimizer.step", Shape: []int{}, Data: []float32{1}}}, nil)
	must(t, err)
	must(t, Commit(root, Manifest{Step: 1, Layout: Layout{1, 1, 1, 1, 0}, Files: []File{f}}, 0, nil))
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	out := t.TempDir()
	for _, tc := range []struct {
		path   string
		opts   ExportOptions
		reason string
	}{
		{filepath.Join(out, "a.safetensors"), ExportOptions{DType: comm.DType(9)}, `dtype(9): want f32, bf16 or f16`},
		{filepath.Join(out, "b.safetensors"), ExportOptions{}, "no tensors to export"},
		{filepath.Join(out, "no", "such", "dir.safetensors"), ExportOptions{Optimizer: true}, "no such file or directory"},
	} {
		err := Export(t.Context(), c, tc.path, tc.opts)
		if err == nil || !strings.HasPrefix(err.Error(), "ckpt: export step-00000001 to ") || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Export(%+v) = %v, want an error saying %q", tc.opts, err, tc.reason)
		}
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("failed exports left %d files", len(ents))
	}
}

// TestExportRounding: the 16-bit exports hold exactly engine/comm's
// scalar rounding of every element (ties, subnormals, overflow, NaNs and a
// sweep of bit patterns), whole vectors and tails alike: a tensor of an odd
// length split at an odd offset between two ranks.
func TestExportRounding(t *testing.T) {
	data := append(specialValues(), math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800001), math.Float32frombits(0x7f800001))
	r := rand.New(rand.NewPCG(1, 2))
	for len(data) < 4099 {
		data = append(data, math.Float32frombits(r.Uint32()))
	}
	root := t.TempDir()
	var files []File
	for rank, span := range [][2]int{{0, 1001}, {1001, len(data)}} {
		f, err := WriteShard(root, 1, rank, []Tensor{{Name: "w", Shape: []int{len(data)}, Offset: span[0], Data: data[span[0]:span[1]]}}, nil)
		must(t, err)
		files = append(files, f)
	}
	must(t, Commit(root, Manifest{Step: 1, Layout: Layout{2, 2, 1, 1, 1}, Files: files}, 0, nil))
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Float16} {
		out := filepath.Join(t.TempDir(), "w.safetensors")
		must(t, Export(t.Context(), c, out, ExportOptions{DType: dt}))
		got, _ := readExport(t, out)
		want := wantBits(data, got["w"].dtype)
		if len(got["w"].bits) != len(want) {
			t.Fatalf("%v: %d elements, want %d", dt, len(got["w"].bits), len(want))
		}
		for i, b := range got["w"].bits {
			if b != want[i] {
				t.Fatalf("%v: element %d (%#08x) is %#x, comm rounds it to %#x", dt, i, math.Float32bits(data[i]), b, want[i])
			}
		}
	}
}

// specialValues are floats whose rounding is easy to get wrong: ties,
// subnormals, overflow, signed zeros and infinities.
func specialValues() []float32 {
	return []float32{
		0, float32(math.Copysign(0, -1)), 1, -1, 1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/2048, 1 + 3.0/2048, // ties for bf16 and f16
		65504, 65519.99, 65520, 70000, -1e30, 3.4e38, float32(math.Inf(1)), float32(math.Inf(-1)),
		6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-10, 1e-40, -1e-45, // f16 subnormals and underflow; f32 subnormals
		3.14159265, -2.71828, 0.1, 1e4 + 0.5,
	}
}
