package planner

import "testing"

// engineStorage is how the built-in engine keeps activations: float32, no
// dropout.
var engineStorage = ActStorage{ElemBytes: 4, NoDropout: true}

// TestModelActivationsClosedForm pins ModelActivations for a GPT shape in
// both storages to the closed forms of docs/planner.md: the paper's
// (34·s·b·h + 5·a·s²·b per layer, 16-bit) and the engine's (4-byte
// elements, no dropout: 64·s·b·h + 4·a·s²·b). Each mode keeps what the
// paper says: selective drops the attention core, full keeps the layer
// input and rebuilds the rest of one layer in backward.
func TestModelActivationsClosedForm(t *testing.T) {
	m := Model{Arch: ArchGPT, Layers: 6, Hidden: 384, Heads: 6, KVHeads: 6, FFN: 4 * 384, Vocab: 257, Seq: 256}
	s, b, h, a, v := 256.0, 3.0, 384.0, 6.0, 257.0
	sbh, as2b := s*b*h, a*s*s*b
	cases := []struct {
		name             string
		p                Precision
		st               ActStorage
		rc               Recompute
		layer, head, wrk float64
	}{
		{"paper none", BF16, ActStorage{}, RecomputeNone, 34*sbh + 5*as2b, 4 * s * b * (h + v), 0},
		{"paper selective", BF16, ActStorage{}, RecomputeSelective, 34 * sbh, 4 * s * b * (h + v), 5 * as2b},
		{"paper full", BF16, ActStorage{}, RecomputeFull, 2 * sbh, 4 * s * b * (h + v), 32*sbh + 5*as2b},
		{"engine none", FP32, engineStorage, RecomputeNone, 64*sbh + 4*as2b, 8*sbh + 4*s*b*v, 0},
		{"engine selective", FP32, engineStorage, RecomputeSelective, 64 * sbh, 8*sbh + 4*s*b*v, 4 * as2b},
		{"engine full", FP32, engineStorage, RecomputeFull, 4 * sbh, 8*sbh + 4*s*b*v, 60*sbh + 4*as2b},
		// The element size applies whatever the precision says.
		{"engine storage at bf16", BF16, engineStorage, RecomputeNone, 64*sbh + 4*as2b, 8*sbh + 4*s*b*v, 0},
	}
	for _, c := range cases {
		got := ModelActivations(m, 3, c.p, c.st, c.rc)
		if !within(got.Layer, c.layer, 1e-12) || !within(got.Head, c.head, 1e-12) || !within(got.WorkingSet, c.wrk, 1e-12) {
			t.Errorf("%s: %+v, want layer %g, head %g, working set %g", c.name, got, c.layer, c.head, c.wrk)
		}
		if c.st == (ActStorage{}) {
			if l := LayerActivations(m, 3, 1, false, c.p, c.rc); l != got.Layer {
				t.Errorf("%s: LayerActivations %g, ModelActivations %g", c.name, l, got.Layer)
			}
		}
	}
}

// TestEvaluateChargesModelActivations: a search charges a TP = PP = 1
// layout exactly ModelActivations with the problem's storage, so a
// framework that allocates what ModelActivations says is planned right.
func TestEvaluateChargesModelActivations(t *testing.T) {
	m := Model{Arch: ArchGPT, Layers: 4, Hidden: 128, Heads: 4, KVHeads: 4, FFN: 512, Vocab: 257, Seq: 128}
	top := Topology{Nodes: 1, GPUsPerNode: 2, GPU: GPU{Name: "x", MemoryBytes: 1 << 40, PeakFLOPS: 1e12, PeakFP32FLOPS: 1e12},
		Intra: Link{Kind: "shm", GbitPerS: 80}, Inter: Link{Kind: "eth", GbitPerS: 10}}
	for _, st := range []ActStorage{{}, engineStorage} {
		for _, rc := range Recomputes {
			opts := DefaultOptions()
			opts.Activations = st
			pr := Problem{Model: m, Topology: top, GlobalBatch: 8, Precision: FP32, Options: opts}
			c := Evaluate(pr, Layout{Grid: Grid{TP: 1, PP: 1, DP: 2}, MicroBatch: 2, Recompute: rc})
			want := ModelActivations(m, 2, FP32, st, rc).Total(m.Layers)
			if !c.Feasible || c.Memory.Activations != want {
				t.Errorf("storage %+v, recompute %s: charged %g bytes (feasible %v, %s), want %g", st, rc, c.Memory.Activations, c.Feasible, c.RejectReason, want)
			}
		}
	}
}

func TestActStorageValidate(t *testing.T) {
	opts := DefaultOptions()
	opts.Activations.ElemBytes = -1
	pr := Problem{Model: gptShape(2, 64, 2), Topology: Topology{Nodes: 1, GPUsPerNode: 1,
		GPU: GPU{Name: "x", MemoryBytes: 1 << 30, PeakFLOPS: 1e12}, Intra: Link{Kind: "x", GbitPerS: 1}, Inter: Link{Kind: "x", GbitPerS: 1}},
		GlobalBatch: 1, Precision: FP32, Options: opts}
	if err := pr.Validate(); err == nil {
		t.Error("a negative activation element size was accepted")
	}
}
