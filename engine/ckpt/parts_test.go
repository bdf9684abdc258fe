package ckpt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/tensorpar"
)

// tpConfig is a GPT-2 whose shapes split over tp 1, 2 and 4 (4 heads) with
// an uneven vocabulary, and 3 layers for an uneven pipeline split.
var tpConfig = model.Config{Layers: 3, Heads: 4, Embd: 8, Seq: 6, Vocab: 37}

// tpLayout is a tensor-, pipeline- and data-parallel layout; ranks are
// numbered TP fastest, then PP, then DP (planner.Grid's order).
type tpLayout struct{ tp, pp, dp int }

func (l tpLayout) world() int { return l.tp * l.pp * l.dp }

// stageOf is the pipeline stage holding a parameter: the embeddings on the
// first, the final LayerNorm on the last, the blocks split 2 + 1 (pp 2).
func stageOf(name string, pp int) int {
	switch {
	case pp == 1 || strings.HasPrefix(name, "transformer.wte.") || strings.HasPrefix(name, "transformer.wpe."):
		return 0
	case strings.HasPrefix(name, "transformer.ln_f."), strings.HasPrefix(name, "transformer.h.2."):
		return pp - 1
	}
	return 0
}

// tpTensors are the full tensors of a test checkpoint: the model's
// parameters and an optimizer moment of each, all elements distinct.
func tpTensors(step int64) []Tensor {
	var out []Tensor
	for _, prefix := range []string{"", "optimizer.exp_avg."} {
		for _, p := range tpConfig.Params() {
			k := len(out)
			data := make([]float32, p.Size())
			for i := range data {
				data[i] = value(step, k, i)
			}
			out = append(out, Tensor{Name: prefix + p.Name, Shape: p.Shape, Data: data})
		}
	}
	return out
}

// partOf is the TP part of a full tensor on tp rank r of tp.
func partOf(name string, r, tp int) tensorpar.Part {
	return tensorpar.Part{Split: tensorpar.SplitOf(strings.TrimPrefix(name, "optimizer.exp_avg.")), Rank: r, Size: tp, Heads: tpConfig.Heads}
}

// rankParts is what rank of layout l saves: the parts of its stage's
// tensors, replicated ones included (WriteParts keeps tp rank 0's); the
// parameters on DP rank 0, and each optimizer moment split over the DP
// ranks as Megatron's distributed optimizer does, each DP rank a block of
// every TP part.
func rankParts(t *testing.T, full []Tensor, l tpLayout, rank int) []PartTensor {
	t.Helper()
	tp, pp, dp := rank%l.tp, rank/l.tp%l.pp, rank/(l.tp*l.pp)
	var out []PartTensor
	for _, x := range full {
		if stageOf(strings.TrimPrefix(x.Name, "optimizer.exp_avg."), l.pp) != pp {
			continue
		}
		p := partOf(x.Name, tp, l.tp)
		data, err := p.Extract(x.Data, x.Shape)
		must(t, err)
		lo, hi := 0, len(data)
		if strings.HasPrefix(x.Name, OptimizerPrefix) {
			lo, hi = comm.Block(len(data), dp, l.dp)
		} else if dp != 0 {
			continue
		}
		out = append(out, PartTensor{Name: x.Name, Shape: x.Shape, Part: p, Offset: lo, Data: data[lo:hi]})
	}
	return out
}

// writeParts writes step's checkpoint of full in layout l through
// WriteParts, every rank concurrently, and commits it.
func writeParts(t *testing.T, root string, step int64, full []Tensor, l tpLayout, edit func(rank int, parts []PartTensor) []PartTensor) error {
	t.Helper()
	files := make([]File, l.world())
	errs := make([]error, l.world())
	var wg sync.WaitGroup
	for r := range l.world() {
		parts := rankParts(t, full, l, r)
		if edit != nil {
			parts = edit(r, parts)
		}
		wg.Go(func() { files[r], errs[r] = WriteParts(root, step, r, parts, stateOf(step, r)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m := Manifest{Step: step, Job: testJob, Layout: Layout{World: l.world(), DP: l.dp, TP: l.tp, PP: l.pp, ZeroStage: 1}, Files: files}
	return Commit(root, m, 0, nil)
}

// writeDense writes step's checkpoint of full from world ranks with
// WriteShard, each tensor cut into the uneven ranges of shardOf.
func writeDense(t *testing.T, root string, step int64, full []Tensor, world int) *Checkpoint {
	t.Helper()
	files := make([]File, world)
	for r := range world {
		f, err := WriteShard(root, step, r, shardOf(full, r, world), stateOf(step, r))
		must(t, err)
		files[r] = f
	}
	m := Manifest{Step: step, Job: testJob, Layout: Layout{World: world, DP: world, TP: 1, PP: 1, ZeroStage: 1}, Files: files}
	must(t, Commit(root, m, 0, nil))
	c, err := Open(context.Background(), filepath.Join(root, StepDirName(step)))
	must(t, err)
	return c
}

// checkLoads fails unless c gives back full as whole tensors, as parts of
// tp 1, 2 and 4, as ZeRO ranges of dp 3, and as dp-3 ranges of tp-4 parts.
func checkLoads(t *testing.T, c *Checkpoint, full []Tensor) {
	t.Helper()
	for _, x := range full {
		got, shape, err := c.Tensor(x.Name)
		must(t, err)
		if !slices.Equal(shape, x.Shape) || !bitsEqual(got, x.Data) {
			t.Fatalf("Tensor(%s): shape %v (want %v) or data differ", x.Name, shape, x.Shape)
		}
		for _, tp := range []int{1, 2, 4} {
			for r := range tp {
				checkPart(t, c, x, partOf(x.Name, r, tp))
			}
		}
		for r := range 3 {
			lo, hi := comm.Block(len(x.Data), r, 3)
			dst := make([]float32, hi-lo)
			must(t, c.ReadRange(x.Name, lo, dst))
			if !bitsEqual(dst, x.Data[lo:hi]) {
				t.Fatalf("ReadRange(%s, %d..%d) differs", x.Name, lo, hi)
			}
		}
	}
}

// checkPart fails unless c gives back part p of x, whole and as dp-3
// ranges.
func checkPart(t *testing.T, c *Checkpoint, x Tensor, p tensorpar.Part) {
	t.Helper()
	want, err := p.Extract(x.Data, x.Shape)
	must(t, err)
	wantShape, err := p.Shape(x.Shape)
	must(t, err)
	got, shape, err := c.ReadPart(x.Name, p)
	must(t, err)
	if !slices.Equal(shape, wantShape) || !bitsEqual(got, want) {
		t.Fatalf("ReadPart(%s, %+v): shape %v (want %v) or data differ", x.Name, p, shape, wantShape)
	}
	for r := range 3 {
		lo, hi := comm.Block(len(want), r, 3)
		dst := make([]float32, hi-lo)
		must(t, c.ReadPartRange(x.Name, p, lo, dst))
		if !bitsEqual(dst, want[lo:hi]) {
			t.Fatalf("ReadPartRange(%s, %+v, %d..%d) differs", x.Name, p, lo, hi)
		}
	}
}

// TestPartsCheckpoint writes a tp2·pp2·dp2 checkpoint of parts (ZeRO-1
// optimizer ranges within the parts) and loads it back in every layout,
// exports it as a dense checkpoint of the same tensors exports, and reads
// each rank's parts back as written.
func TestPartsCheckpoint(t *testing.T) {
	root, full := t.TempDir(), tpTensors(5)
	l := tpLayout{tp: 2, pp: 2, dp: 2}
	must(t, writeParts(t, root, 5, full, l, nil))
	dir := filepath.Join(root, StepDirName(5))
	must(t, Verify(context.Background(), dir))
	c, err := Open(context.Background(), dir)
	must(t, err)
	checkIndex(t, c.Manifest)
	checkLoads(t, c, full)

	dense := writeDense(t, t.TempDir(), 5, full, 3)
	for _, opts := range []ExportOptions{{}, {DType: comm.BFloat16, Optimizer: true}} {
		if !sameExport(t, c, dense, opts) {
			t.Fatalf("export %+v: the tp2·pp2·dp2 checkpoint's export differs from the dense one's", opts)
		}
	}

	for r := range l.world() {
		got, state, err := c.Parts(r)
		must(t, err)
		want := rankParts(t, full, l, r)
		want = slices.DeleteFunc(want, func(p PartTensor) bool { return p.Part.Split == tensorpar.Replicated && p.Part.Rank != 0 })
		if len(got) != len(want) || len(want) == 0 || string(state) != string(stateOf(5, r)) {
			t.Fatalf("Parts(%d): %d tensors, state %q; want %d, %q", r, len(got), state, len(want), stateOf(5, r))
		}
		for i := range want {
			g, w := got[i], want[i]
			if isWhole(w.Part) {
				w.Part = tensorpar.Part{Split: tensorpar.Replicated, Size: 1}
			} else if w.Part.Split != tensorpar.QKVHeads {
				w.Part.Heads = 0 // one spelling per part: heads only where they count
			}
			if g.Name != w.Name || g.Part != w.Part || g.Offset != w.Offset || !slices.Equal(g.Shape, w.Shape) || !bitsEqual(g.Data, w.Data) {
				t.Fatalf("Parts(%d)[%d] = %s %+v at %d, want %s %+v at %d", r, i, g.Name, g.Part, g.Offset, w.Name, w.Part, w.Offset)
			}
		}
		if _, _, err := c.Shard(r); err == nil || !strings.Contains(err.Error(), "Parts") {
			t.Fatalf("Shard(%d) of a file of parts: %v, want a refusal naming Parts", r, err)
		}
	}
}

// checkIndex checks how the tp2·pp2·dp2 checkpoint lists a few tensors: a
// replicated one once, by tp rank 0 of its stage; c_attn as two q|k|v head
// parts; an optimizer moment as DP ranges of each part.
func checkIndex(t *testing.T, m Manifest) {
	t.Helper()
	find := func(name string) TensorIndex {
		i := slices.IndexFunc(m.Tensors, func(x TensorIndex) bool { return x.Name == name })
		if i < 0 {
			t.Fatalf("no tensor %s in the manifest", name)
		}
		return m.Tensors[i]
	}
	if s := find("transformer.ln_f.weight").Shards; len(s) != 1 || s[0].File != RankFileName(2) || hasPart(s[0]) {
		t.Errorf("ln_f.weight (replicated, last stage): shards %+v, want one, whole, in rank 2's file", s)
	}
	want := []ShardRef{
		{File: RankFileName(0), Len: 8 * 12, Part: PartRef{Split: "qkv-heads", Rank: 0, Size: 2, Heads: 4}},
		{File: RankFileName(1), Len: 8 * 12, Part: PartRef{Split: "qkv-heads", Rank: 1, Size: 2, Heads: 4}},
	}
	if s := find("transformer.h.0.attn.c_attn.weight").Shards; !slices.Equal(s, want) {
		t.Errorf("c_attn.weight: shards %+v, want %+v", s, want)
	}
	if s := find("optimizer.exp_avg.transformer.h.2.mlp.c_fc.weight").Shards; len(s) != 4 || s[1].File != RankFileName(6) || s[1].Offset != 64 || s[1].Part.Rank != 0 {
		t.Errorf("optimizer c_fc.weight of stage 1: shards %+v, want dp ranges of each tp part", s)
	}
}

// TestPartsFromRanges reads TP parts of every size out of a dense
// checkpoint of uneven ZeRO ranges: the reader takes any layout.
func TestPartsFromRanges(t *testing.T) {
	full := tpTensors(3)
	checkLoads(t, writeDense(t, t.TempDir(), 3, full, 3), full)
}

// TestWritePartsWholeIsWriteShard: parts that are whole tensors (tp 1)
// give the very file WriteShard writes, so a tp-1 layout's checkpoints stay
// as they were.
func TestWritePartsWholeIsWriteShard(t *testing.T) {
	full := tpTensors(2)
	var parts []PartTensor
	for _, x := range shardOf(full, 1, 2) {
		parts = append(parts, PartTensor{Name: x.Name, Shape: x.Shape, Part: partOf(x.Name, 0, 1), Offset: x.Offset, Data: x.Data})
	}
	a, b := t.TempDir(), t.TempDir()
	fa, err := WriteParts(a, 2, 1, parts, stateOf(2, 1))
	must(t, err)
	fb, err := WriteShard(b, 2, 1, shardOf(full, 1, 2), stateOf(2, 1))
	must(t, err)
	if fa != fb {
		t.Fatalf("WriteParts of whole tensors: %+v, WriteShard: %+v", fa, fb)
	}
}

// TestPartsDamaged: a flipped byte in a part file fails Verify.
func TestPartsDamaged(t *testing.T) {
	root, full := t.TempDir(), tpTensors(4)
	must(t, writeParts(t, root, 4, full, tpLayout{tp: 2, pp: 1, dp: 1}, nil))
	dir := filepath.Join(root, StepDirName(4))
	flip(t, filepath.Join(dir, RankFileName(1)), -5)
	var inv *InvalidError
	if err := Verify(context.Background(), dir); !errors.As(err, &inv) || inv.File != RankFileName(1) || !strings.Contains(inv.Reason, "sha256") {
		t.Fatalf("Verify of a damaged part file: %v, want a sha256 mismatch of %s", err, RankFileName(1))
	}
}

// TestPartsRefused: Commit refuses parts that do not tile a tensor, and
// Open a manifest edited so its parts do not; the errors say which part.
func TestPartsRefused(t *testing.T) {
	const cfc = "transformer.h.1.mlp.c_fc.weight"
	l := tpLayout{tp: 2, pp: 1, dp: 1}
	drop := func(rank int) func(int, []PartTensor) []PartTensor {
		return func(r int, ps []PartTensor) []PartTensor {
			if r != rank {
				return ps
			}
			return slices.DeleteFunc(ps, func(p PartTensor) bool { return p.Name == cfc })
		}
	}
	setPart := func(rank int, p tensorpar.Part) func(int, []PartTensor) []PartTensor {
		return func(r int, ps []PartTensor) []PartTensor {
			for i := range ps {
				if r == rank && ps[i].Name == cfc {
					d, err := p.Extract(tpTensors(1)[slices.IndexFunc(tpTensors(1), func(x Tensor) bool { return x.Name == cfc })].Data, ps[i].Shape)
					must(t, err)
					ps[i].Part, ps[i].Data = p, d
				}
			}
			return ps
		}
	}
	for _, tc := range []struct {
		name string
		edit func(int, []PartTensor) []PartTensor
		want string
	}{
		{"missing", drop(1), "no shard holds tp part 1 of 2 (columns)"},
		{"missing first", drop(0), "no shard holds tp part 0 of 2 (columns)"},
		{"twice", setPart(1, tensorpar.Part{Split: tensorpar.Columns, Rank: 0, Size: 2}), "tp part 0 of 2 (columns): shards overlap"},
		{"two layouts", setPart(1, tensorpar.Part{Split: tensorpar.Columns, Rank: 1, Size: 4}), "parts of two layouts overlap"},
		{"whole beside parts", setPart(1, tensorpar.Part{Split: tensorpar.Replicated, Size: 1}), "the whole tensor (in rank-00001.safetensors) is listed beside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := writeParts(t, t.TempDir(), 1, tpTensors(1), l, tc.edit)
			if err == nil || !strings.Contains(err.Error(), cfc) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("commit: %v, want an error naming %s and %q", err, cfc, tc.want)
			}
		})
	}

	root := t.TempDir()
	must(t, writeParts(t, root, 1, tpTensors(1), l, nil))
	dir := filepath.Join(root, StepDirName(1))
	orig, err := os.ReadFile(filepath.Join(dir, ManifestName))
	must(t, err)
	for _, tc := range []struct {
		name string
		edit func(*ShardRef)
		want string
	}{
		{"rank", func(s *ShardRef) { s.Part.Rank = 0 }, "overlap"},
		{"size", func(s *ShardRef) { s.Part.Size = 3 }, "parts of two layouts"},
		{"split", func(s *ShardRef) { s.Part.Split = "diagonal" }, `unknown split "diagonal"`},
		{"no part", func(s *ShardRef) { s.Part = PartRef{} }, "the whole tensor"},
		{"len", func(s *ShardRef) { s.Len-- }, "no shard holds elements"},
	} {
		t.Run("manifest "+tc.name, func(t *testing.T) {
			editManifest(t, dir, func(m *Manifest) {
				for i := range m.Tensors {
					if m.Tensors[i].Name == cfc {
						tc.edit(&m.Tensors[i].Shards[1])
					}
				}
			})
			defer func() { must(t, os.WriteFile(filepath.Join(dir, ManifestName), orig, 0o644)) }()
			var inv *InvalidError
			_, err := Open(context.Background(), dir)
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), cfc) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want an invalid manifest naming %s and %q", err, cfc, tc.want)
			}
		})
	}
}

// TestRunsMatchExtract holds the reader's runs to tensorpar's parts: every
// element of every part of every split and size lies where Extract takes
// it from.
func TestRunsMatchExtract(t *testing.T) {
	checked := 0
	for _, shape := range [][]int{{37, 8}, {8, 24}, {24}, {5, 3, 12}, {8, 32}} {
		n := 1
		for _, d := range shape {
			n *= d
		}
		iota := make([]float32, n)
		for i := range iota {
			iota[i] = float32(i)
		}
		for _, split := range []tensorpar.Split{tensorpar.Replicated, tensorpar.Rows, tensorpar.Columns, tensorpar.QKVHeads} {
			for _, size := range []int{1, 2, 3, 4} {
				for r := range size {
					p := tensorpar.Part{Split: split, Rank: r, Size: size, Heads: 4}
					want, err := p.Extract(iota, shape)
					if err != nil {
						continue // a part the shape does not allow
					}
					g, err := runsOf(p, shape)
					must(t, err)
					if g.count*g.k != len(want) {
						t.Fatalf("%v of %v: %d runs of %d, the part has %d elements", p, shape, g.count, g.k, len(want))
					}
					for q, f := range want {
						if at := g.start(q/g.k) + q%g.k; at != int(f) {
							t.Fatalf("%+v of %v: element %d at %d, Extract takes it from %v", p, shape, q, at, f)
						}
					}
					checked++
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d parts checked", checked)
	}
}

// TestReadPartRefuses: pieces outside a tensor, and parts its shape does
// not allow, are errors naming the tensor.
func TestReadPartRefuses(t *testing.T) {
	full := tpTensors(6)
	c := writeDense(t, t.TempDir(), 6, full, 2)
	name := "transformer.h.0.attn.c_attn.weight"
	for _, err := range []error{
		c.ReadRange(name, 8*24-3, make([]float32, 4)),
		c.ReadRange(name, -1, make([]float32, 1)),
		c.ReadPartRange(name, partOf(name, 1, 2), 95, make([]float32, 2)),
		func() error { _, _, err := c.ReadPart(name, partOf(name, 0, 3)); return err }(),
		func() error { _, _, err := c.ReadPart("no.such", partOf(name, 0, 2)); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), "ckpt: ") {
			t.Fatalf("got %v, want a ckpt error", err)
		}
	}
}

// TestPartsLarge runs the reader and Export over tensors and parts larger
// than a chunk, so that windows refill, long runs are read straight into
// place, and Export assembles a tensor from several chunks.
func TestPartsLarge(t *testing.T) {
	shapes := []struct {
		name  string
		shape []int
	}{
		{"transformer.wte.weight", []int{1001, 600}},                            // rows: parts above a chunk
		{"transformer.h.0.attn.c_attn.weight", []int{200, 1800}},                // q|k|v heads
		{"optimizer.exp_avg.transformer.h.0.mlp.c_fc.weight", []int{200, 2400}}, // columns, dp ranges
	}
	var full []Tensor
	for k, s := range shapes {
		data := make([]float32, s.shape[0]*s.shape[1])
		for i := range data {
			data[i] = value(9, k, i)
		}
		full = append(full, Tensor{Name: s.name, Shape: s.shape, Data: data})
	}
	if n := len(full[0].Data) / 2; n <= chunkElems {
		t.Fatalf("a wte part has %d elements, not above a chunk (%d)", n, chunkElems)
	}
	root := t.TempDir()
	must(t, writeParts(t, root, 9, full, tpLayout{tp: 2, pp: 1, dp: 2}, nil))
	c, err := Open(context.Background(), filepath.Join(root, StepDirName(9)))
	must(t, err)
	checkLoads(t, c, full)
	dense := writeDense(t, t.TempDir(), 9, full, 2)
	if !sameExport(t, c, dense, ExportOptions{Optimizer: true}) {
		t.Fatal("the export of large tp parts differs from the dense checkpoint's")
	}
}

// TestShardRefJSONUnchanged: a shard without a part is spelled as before
// parts existed, so manifests of DP and ZeRO layouts (and their sha256)
// are unchanged.
func TestShardRefJSONUnchanged(t *testing.T) {
	b, err := json.Marshal(ShardRef{File: "rank-00000.safetensors", Offset: 3, Len: 4})
	must(t, err)
	if want := `{"file":"rank-00000.safetensors","offset":3,"len":4}`; string(b) != want {
		t.Fatalf("ShardRef without a part: %s, want %s", b, want)
	}
	b, err = json.Marshal(ShardRef{File: "f", Len: 4, Part: PartRef{Split: "columns", Rank: 1, Size: 2}})
	must(t, err)
	if want := `{"file":"f","offset":0,"len":4,"part":{"split":"columns","rank":1,"size":2}}`; string(b) != want {
		t.Fatalf("ShardRef with a part: %s, want %s", b, want)
	}
}

// sameExport reports whether c and dense export (opts) to the same bytes.
func sameExport(t *testing.T, c, dense *Checkpoint, opts ExportOptions) bool {
	t.Helper()
	a, b := filepath.Join(t.TempDir(), "tp.safetensors"), filepath.Join(t.TempDir(), "dense.safetensors")
	must(t, Export(context.Background(), c, a, opts))
	must(t, Export(context.Background(), dense, b, opts))
	ab, err := os.ReadFile(a)
	must(t, err)
	bb, err := os.ReadFile(b)
	must(t, err)
	return bytes.Equal(ab, bb)
}
