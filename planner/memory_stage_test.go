package planner

import (
	"fmt"
	"testing"
)

// TestRankActivationsClosedForm pins the activations a pipeline stage's
// rank is charged (RankMemory) to Megatron-LM's tensors in the engine's storage (4-byte
// elements, no dropout): per layer 64·s·b·h + 4·a·s²·b with neither TP nor
// SP, its parts split by t as Korthikanti et al. 2022 split them; 1F1B's
// min(p−i, m) micro-batches in flight on stage i; and the head on the last
// stage only: the final norm's input and output (8·s·b·h, replicated over
// TP without sequence parallelism, split with it) and the fp32 logits
// (4·s·b·V/t, vocabulary-parallel either way).
func TestRankActivationsClosedForm(t *testing.T) {
	m := Model{Arch: ArchGPT, Layers: 5, Hidden: 64, Heads: 4, KVHeads: 4, FFN: 256, Vocab: 96, Seq: 32}
	s, b, h, a, v := 32.0, 2.0, 64.0, 4.0, 96.0
	sbh, as2b := s*b*h, a*s*s*b
	cases := []struct {
		tp, pp, stage, layers, inflight int
		sp                              bool
	}{
		{1, 1, 0, 5, 1, false},
		{2, 1, 0, 5, 1, false},
		{2, 1, 0, 5, 1, true},
		{1, 2, 0, 2, 2, false},
		{1, 2, 1, 3, 1, false},
		{2, 2, 0, 2, 2, true},
		{2, 2, 1, 3, 1, true},
		{2, 2, 1, 3, 1, false},
		{4, 1, 0, 5, 1, true},
	}
	for _, c := range cases {
		tf := float64(c.tp)
		rt := 1.0 // the divisor of the replicated tensors
		if c.sp {
			rt = tf
		}
		// 48·s·b·h of Q, K, V, the projection input and the MLP's two
		// tensors, split by TP; 16·s·b·h of the two norms' inputs and
		// outputs, split only by SP; the probabilities, split by heads.
		layer := 48*sbh/tf + 16*sbh/rt + 4*as2b/tf
		want := float64(c.layers) * layer * float64(c.inflight)
		if c.stage == c.pp-1 {
			want += 8*sbh/rt + 4*s*b*v/tf
		}
		t.Run(fmt.Sprintf("tp%d pp%d stage %d sp=%v", c.tp, c.pp, c.stage, c.sp), func(t *testing.T) {
			opts := DefaultOptions()
			opts.Activations, opts.SequenceParallel = engineStorage, c.sp
			pr := Problem{Model: m, Topology: memTopology, GlobalBatch: 8, Precision: FP32, Options: opts}
			l := Layout{Grid: Grid{TP: c.tp, PP: c.pp, DP: 1}, MicroBatch: 2, Recompute: RecomputeNone}
			for tp := range c.tp { // the same on every TP rank: the vocabulary of 96 divides by t
				mem, err := RankMemory(pr, l, Coord{PP: c.stage, TP: tp})
				if err != nil {
					t.Fatal(err)
				}
				if got := mem.Activations; !within(got, want, 1e-12) {
					t.Errorf("tp rank %d: charged %g bytes, want %g", tp, got, want)
				}
			}
		})
	}
}

// memTopology is a node of 4 GPUs that nothing here runs out of.
var memTopology = Topology{Nodes: 1, GPUsPerNode: 4, GPU: GPU{Name: "x", MemoryBytes: 1 << 40, PeakFLOPS: 1e12, PeakFP32FLOPS: 1e12},
	Intra: Link{Kind: "shm", GbitPerS: 80}, Inter: Link{Kind: "eth", GbitPerS: 10}}
