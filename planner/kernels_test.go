package planner

import "testing"

// TestLayerTraffic pins the memory-bound traffic of a GPT layer to its
// closed form (docs/planner.md, "Compute"), 16-bit, per micro-batch on one
// of t TP ranks:
//
//	forward  s·b·h·(22 + 20/t) + 9·a·s²·b/t
//	backward s·b·h·(34 + 28/t) + 11·a·s²·b/t
//
// with sequence parallelism the 22 and 34 are divided by t too, and
// without dropout (the built-in engine) they are 20 and 32 and the score
// terms 4 and 6. The counts are exact, so the tolerance is rounding.
func TestLayerTraffic(t *testing.T) {
	for _, c := range korthikanti {
		m := gptShape(c.l, c.h, c.a)
		s, b, h, a, tp := 2048.0, 2.0, float64(c.h), float64(c.a), float64(c.t)
		sbh, scores := s*b*h, a*s*s*b/tp
		cases := []struct {
			name     string
			x        actShape
			fwd, bwd float64
		}{
			{"tensor parallel", newActShape(m, 2, c.t, false, BF16, ActStorage{}),
				sbh*(22+20/tp) + 9*scores, sbh*(34+28/tp) + 11*scores},
			{"tensor + sequence parallel", newActShape(m, 2, c.t, true, BF16, ActStorage{}),
				sbh*(22+20)/tp + 9*scores, sbh*(34+28)/tp + 11*scores},
			{"no dropout", newActShape(m, 2, c.t, false, BF16, ActStorage{NoDropout: true}),
				sbh*(20+20/tp) + 4*scores, sbh*(32+28/tp) + 6*scores},
		}
		for _, k := range cases {
			got := k.x.layerTraffic(m)
			if !within(got.fwd, k.fwd, 1e-12) || !within(got.bwd, k.bwd, 1e-12) {
				t.Errorf("%s %s: forward %.6g, backward %.6g bytes; want %.6g, %.6g", c.name, k.name, got.fwd, got.bwd, k.fwd, k.bwd)
			}
		}
	}
}

// TestGEMMEfficiency: a multiply reaches the plateau only when all three
// of its dimensions are large, half of it per dimension at gemmHalf, and
// the same rate whichever dimension is which (its backward multiplies are
// its dimensions permuted).
func TestGEMMEfficiency(t *testing.T) {
	if e := (gemm{1 << 30, 1 << 30, 1 << 30, 1}).efficiency(0.8, gemmHalf); !within(e, 0.8, 1e-6) {
		t.Errorf("huge multiply: %.6f of peak, want the plateau 0.8", e)
	}
	if e := (gemm{gemmHalf, 1 << 30, 1 << 30, 1}).efficiency(0.8, gemmHalf); !within(e, 0.4, 1e-6) {
		t.Errorf("one dimension of %d: %.6f of peak, want half the plateau", gemmHalf, e)
	}
	a, b := gemm{2048, 96, 2048, 24}, gemm{96, 2048, 2048, 24}
	if !within(a.efficiency(0.8, gemmHalf), b.efficiency(0.8, gemmHalf), 1e-12) || a.flops() != b.flops() {
		t.Errorf("permuted dimensions: %g and %g of peak", a.efficiency(0.8, gemmHalf), b.efficiency(0.8, gemmHalf))
	}
}

// TestSmallModelsLoseMoreToMemoryBoundWork is why small models reach a
// lower fraction of peak: at the same micro-batch and one GPU, the
// element-wise traffic per FLOP of the weight multiplies falls as 1/h and
// the attention scores' as s/(h·d_head), so the 1.7B model of Narayanan et
// al. moves over 10 times more bytes per FLOP than the 1T (h 2304 against 25600).
func TestSmallModelsLoseMoreToMemoryBoundWork(t *testing.T) {
	perFLOP := func(name string) float64 {
		m := Presets[name].Model
		x := newActShape(m, 1, 1, false, FP16, ActStorage{})
		tr := x.layerTraffic(m)
		var flops float64
		for _, g := range layerGEMMs(m, 1, 1) {
			flops += g.flops()
		}
		return (tr.fwd + tr.bwd) / flops
	}
	small, large := perFLOP("megatron-1.7b"), perFLOP("megatron-1t")
	t.Logf("bytes per weight FLOP: 1.7B %.3g, 1T %.3g", small, large)
	if small < 10*large {
		t.Errorf("bytes per weight FLOP: 1.7B %.3g, 1T %.3g; want the 1.7B's at least 10× the 1T's", small, large)
	}
}
