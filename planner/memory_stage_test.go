package planner

import (
	"fmt"
	"testing"
)

// TestStageActivationsClosedForm pins what a pipeline stage's rank is
// charged to Megatron-LM's tensors in the engine's storage (4-byte
// elements, no dropout): per layer 64·s·b·h + 4·a·s²·b with neither TP nor
// SP, its parts split by t as Korthikanti et al. 2022 split them; 1F1B's
// min(p−i, m) micro-batches in flight on stage i; and the head on the last
// stage only: the final norm's input and output (8·s·b·h, replicated over
// TP without sequence parallelism, split with it) and the fp32 logits
// (4·s·b·V/t, vocabulary-parallel either way).
func TestStageActivationsClosedForm(t *testing.T) {
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
			pr := Problem{Model: m, GlobalBatch: 8, Precision: FP32, Options: opts}
			got, err := StageActivations(pr, Layout{Grid: Grid{TP: c.tp, PP: c.pp, DP: 1}, MicroBatch: 2, Recompute: RecomputeNone}, c.stage)
			if err != nil {
				t.Fatal(err)
			}
			if !within(got, want, 1e-12) {
				t.Errorf("charged %g bytes, want %g", got, want)
			}
		})
	}
}

// TestStageActivationsRefuses: a stage outside the layout, or a layout
// that is not one, is an error, not a figure.
func TestStageActivationsRefuses(t *testing.T) {
	pr := Problem{Model: gptShape(2, 64, 2), GlobalBatch: 4, Precision: FP32, Options: DefaultOptions()}
	for _, c := range []struct {
		l     Layout
		stage int
	}{
		{Layout{Grid: Grid{TP: 1, PP: 2, DP: 1}, MicroBatch: 1}, 2},
		{Layout{Grid: Grid{TP: 1, PP: 2, DP: 1}, MicroBatch: 1}, -1},
		{Layout{Grid: Grid{TP: 0, PP: 1, DP: 1}, MicroBatch: 1}, 0},
		{Layout{Grid: Grid{TP: 1, PP: 1, DP: 1}, MicroBatch: 0}, 0},
	} {
		if got, err := StageActivations(pr, c.l, c.stage); err == nil {
			t.Errorf("%+v stage %d: %g bytes, want an error", c.l, c.stage, got)
		}
	}
}
