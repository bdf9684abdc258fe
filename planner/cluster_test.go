package planner

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// smallModel is the engine's small preset, the shape the CPU description
// is measured on (engine/train.MeasureCPU: a layer at 2 × 256 tokens).
var smallModel = Model{Name: "small", Arch: ArchGPT, Layers: 6, Hidden: 384, Heads: 6, Vocab: 257, Seq: 256}.Normalized()

// cpuProblem is the small model on ranks ranks of one host of cpus cores,
// as run --auto plans it (fp32, activations as the engine keeps them).
func cpuProblem(ranks, cpus int) Problem {
	o := DefaultOptions()
	o.Activations = ActStorage{ElemBytes: 4, NoDropout: true}
	return Problem{Model: smallModel, Topology: DefaultCPUSpeed.Topology([]int{ranks}, 16<<30, cpus),
		GlobalBatch: 8, Precision: FP32, Options: o}
}

// TestCPUTopologyOversubscribed: with more ranks than cores every rank
// gets its share of the cores in time, so four ranks on two cores are no
// faster than one rank on both. The engine runs one thread per rank then,
// and a description that gave each rank a whole core predicted dp4 twice
// as fast as one rank.
func TestCPUTopologyOversubscribed(t *testing.T) {
	top := DefaultCPUSpeed.Topology([]int{4}, 16<<30, 2)
	if want := 0.5 * DefaultCPUSpeed.GEMMFLOPSPerCore / DefaultOptions().Efficiency; !within(top.GPU.PeakFLOPS, want, 1e-12) {
		t.Errorf("4 ranks on 2 cores: peak %g FLOP/s, want half a core's %g", top.GPU.PeakFLOPS, want)
	}
	one := Evaluate(cpuProblem(1, 2), Layout{Grid: Grid{TP: 1, PP: 1, DP: 1}, MicroBatch: 2, Recompute: RecomputeNone})
	dp4 := Evaluate(cpuProblem(4, 2), Layout{Grid: Grid{TP: 1, PP: 1, DP: 4}, MicroBatch: 2, Recompute: RecomputeNone})
	if !one.Feasible || !dp4.Feasible {
		t.Fatalf("infeasible: %q, %q", one.RejectReason, dp4.RejectReason)
	}
	if dp4.StepTime < one.StepTime {
		t.Errorf("dp4 on 2 cores predicted at %.0f ms a step, faster than 1 rank's %.0f ms", dp4.StepTime*1e3, one.StepTime*1e3)
	}
	// Threads are whole: 3 ranks on 8 cores run 2 threads each.
	if got := rankCores(8, 3); got != 2 {
		t.Errorf("3 ranks on 8 cores: %g cores each, want 2", got)
	}
}

// TestCPUGEMMRate: the cost model gives back the measured GEMM rate on the
// shapes it is measured on (a small layer's weight multiplies at 512
// tokens), and the attention's multiplies, whose inner or outer dimension
// is a head's 64, run near it as the engine's do. A GPU's saturation
// (gemmHalf 128) charged a CPU rank twice the time for the first and four
// times for the second.
func TestCPUGEMMRate(t *testing.T) {
	top := DefaultCPUSpeed.Topology([]int{1}, 16<<30, 1)
	eff, half := DefaultOptions().Efficiency, gemmHalfOf(top.GPU)
	rate := func(gs []gemm) float64 {
		var flops float64
		for _, g := range gs {
			flops += g.flops()
		}
		return flops / gemmTime(eff, top.GPU.Peak(FP32), half, gs...)
	}
	want := DefaultCPUSpeed.GEMMFLOPSPerCore
	if got := rate(layerGEMMs(smallModel, 2, 1)); !within(got, want, 0.05) {
		t.Errorf("layer multiplies at %.0f GFLOP/s, want the measured %.0f within 5%%", got/1e9, want/1e9)
	}
	if got := rate(attentionGEMMs(smallModel, 2, 1)); got < 0.85*want {
		t.Errorf("attention multiplies at %.0f GFLOP/s, want at least 85%% of the measured %.0f", got/1e9, want/1e9)
	}
}

// TestLayerKernelBytes: the traffic a calibration divides by the engine's
// kernel time leaves out the attention scores (so it does not depend on
// the heads) and grows with the tokens.
func TestLayerKernelBytes(t *testing.T) {
	act := ActStorage{ElemBytes: 4, NoDropout: true}
	one := LayerKernelBytes(smallModel, 1, act)
	heads := smallModel
	heads.Heads, heads.KVHeads = 12, 12
	if got := LayerKernelBytes(heads, 1, act); got != one {
		t.Errorf("12 heads: %g bytes, 6 heads %g: the scores' share is not left out", got, one)
	}
	if got := LayerKernelBytes(smallModel, 2, act); !within(got, 2*one, 1e-12) {
		t.Errorf("2 sequences: %g bytes, want twice one's %g", got, one)
	}
	if !(one > 0) {
		t.Errorf("one sequence: %g bytes", one)
	}
}

// TestGEMMHalfInTopology: a topology file may give gemm_half; a negative
// or NaN one is refused naming the field.
func TestGEMMHalfInTopology(t *testing.T) {
	top := DefaultCPUSpeed.Topology([]int{2}, 16<<30, 2)
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseTopology(b)
	if err != nil || back.GPU.GEMMHalf != cpuGEMMHalf {
		t.Errorf("round trip: gemm_half %g, %v; want %d", back.GPU.GEMMHalf, err, cpuGEMMHalf)
	}
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		bad := top
		bad.GPU.GEMMHalf = v
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "gemm_half") {
			t.Errorf("gemm_half %g: %v, want an error naming gemm_half", v, err)
		}
	}
}
