package train

import (
	"fmt"
	"slices"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/zero"
)

// The checkpoint of a tensor- and pipeline-parallel rank holds its parts
// of the full Hugging Face tensors (ckpt.WriteParts), so that any layout
// can resume it: the parameters under their own names (the fp32 master
// weights in mixed precision, as the data-parallel path saves them, so
// that bf16 and fp16 runs reshard as fp32 ones do), the Adam moments
// as parts of the same tensors under zero's optimizer names. Each element
// is saved once: the DP replicas of a shard split it as ZeRO-1 owns it
// (comm.Block of the flat shard), a tensor replicated over TP is saved by
// TP rank 0 (WriteParts leaves the others' out), and the tied token
// embedding by the first pipeline stage only.

// savedRange is the range [lo, hi) of the rank's flat shard it saves: the
// block its DP rank owns at ZeRO-1, whatever the stage.
func (g *gridRank) savedRange() (lo, hi int) {
	return comm.Block(len(g.stage.Params), g.groups.Coord.DP, g.groups.Grid.DP)
}

// tiedCopy reports whether p is the last stage's copy of the tied
// embedding, which the first stage saves.
func (g *gridRank) tiedCopy(p model.ShardParam) bool {
	return p.Name == tiedEmbedding && g.groups.Grid.PP > 1 && !g.groups.IsFirstStage()
}

// tiedEmbedding is GPT-2's token embedding, also its output layer.
const tiedEmbedding = "transformer.wte.weight"

// parts is what the rank writes: the pieces of its saved range, cut at
// its tensors, of the parameters and of both moments.
func (g *gridRank) parts() []ckpt.PartTensor {
	lo, hi := g.savedRange()
	olo, _ := g.opt.Owned()
	opt := g.opt.Optimizer()
	sources := []struct {
		prefix string
		data   func(a, b int) []float32
	}{
		{"", func(a, b int) []float32 { return g.opt.Masters()[a-olo : b-olo] }},
		{zero.ExpAvgPrefix, func(a, b int) []float32 { return opt.M[a-olo : b-olo] }},
		{zero.ExpAvgSqPrefix, func(a, b int) []float32 { return opt.V[a-olo : b-olo] }},
	}
	var out []ckpt.PartTensor
	for _, src := range sources {
		for _, p := range g.stage.Shards() {
			a, b := max(lo, p.Offset), min(hi, p.Offset+p.Size())
			if a >= b || g.tiedCopy(p) {
				continue
			}
			out = append(out, ckpt.PartTensor{Name: src.prefix + p.Name, Shape: p.Full.Shape, Part: p.Part,
				Offset: a - p.Offset, Data: src.data(a, b)})
		}
	}
	return out
}

// load fills the stage's parameters and the moments the rank owns from c,
// whatever layout wrote it: each tensor's part is assembled from the
// shards that hold it (ckpt's ReadPart and ReadPartRange). The saved
// values are fp32 masters: in mixed precision the optimizer keeps those it
// owns and rounds the parameters (DistOptimizer.Reload).
func (g *gridRank) load(c *ckpt.Checkpoint) error {
	if err := g.loadParts(c); err != nil {
		return err
	}
	g.opt.Reload()
	return nil
}

// loadParts is load's reading of every tensor the rank holds.
func (g *gridRank) loadParts(c *ckpt.Checkpoint) error {
	olo, ohi := g.opt.Owned()
	opt := g.opt.Optimizer()
	for _, p := range g.stage.Shards() {
		data, shape, err := c.ReadPart(p.Name, p.Part)
		if err != nil {
			return err
		}
		if !slices.Equal(shape, p.Shape) {
			return fmt.Errorf("tensor %s: its part %v has shape %v, this rank's is %v: is this checkpoint of the same model?", p.Name, p.Part, shape, p.Shape)
		}
		copy(g.stage.Params[p.Offset:p.Offset+p.Size()], data)
		a, b := max(olo, p.Offset), min(ohi, p.Offset+p.Size())
		if a >= b {
			continue
		}
		for _, m := range []struct {
			prefix string
			dst    []float32
		}{{zero.ExpAvgPrefix, opt.M[a-olo : b-olo]}, {zero.ExpAvgSqPrefix, opt.V[a-olo : b-olo]}} {
			if err := c.ReadPartRange(m.prefix+p.Name, p.Part, a-p.Offset, m.dst); err != nil {
				return err
			}
		}
	}
	return nil
}
