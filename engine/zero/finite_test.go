package zero

import (
	"math"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

// newTestEngine is a one-rank engine of testCfg with params and grads of
// dt, and gradients that fill sets to 0.01, one of them to bad.
func newTestEngine(t *testing.T, dt comm.DType, sc ScalerConfig) (e *Engine, fill func(bad float32)) {
	t.Helper()
	flat := make([]float32, testCfg.NumParams())
	model.InitParams(testCfg, 1, flat)
	cfg := Config{Stage: 0, Params: dt, Grads: dt, FirstBucket: 1 << 20, Bucket: 1 << 20, Scaler: sc,
		Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
	e, err := New(cfg, testCfg, nil, flat)
	if err != nil {
		t.Fatal(err)
	}
	return e, func(bad float32) {
		e.BeginMicro(0, 1)
		for u := len(testCfg.Units()) - 1; u >= 0; u-- {
			g := e.Grads(u)
			for i := range g {
				g[i] = 0.01
			}
			if u == 1 {
				g[3] = bad
			}
			e.GradsDone(u)
		}
	}
}

// TestNonFiniteGradientsNeverUpdate: in fp32 and bf16 (no loss scaling)
// and in fp16 whose loss scale is at its minimum, a NaN or infinite
// gradient updates nothing and is reported as NonFinite but not Skipped
// (the scaler cannot absorb it), with the norm NaN or +Inf rather than the
// norm of the finite values.
func TestNonFiniteGradientsNeverUpdate(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for _, tc := range []struct {
		name string
		dt   comm.DType
		sc   ScalerConfig
		bad  float32
		norm float64
	}{
		{"fp32 NaN", comm.Float32, ScalerConfig{}, nan, math.NaN()},
		{"bf16 -Inf", comm.BFloat16, ScalerConfig{}, inf, math.Inf(1)},
		{"fp16 at min scale", comm.Float16, ScalerConfig{InitialScale: 4, MinScale: 4}, nan, math.NaN()},
		{"fp16 static scale", comm.Float16, ScalerConfig{Static: 8}, inf, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, fill := newTestEngine(t, tc.dt, tc.sc)
			before := slices.Clone(e.Shard()[0].Data)
			fill(tc.bad)
			res, err := e.Step(1e-3)
			if err != nil {
				t.Fatal(err)
			}
			if !res.NonFinite || res.Skipped || !sameFloat(res.Norm, tc.norm) {
				t.Errorf("step: %+v, want NonFinite, not Skipped, norm %v", res, tc.norm)
			}
			if e.opt.Step != 0 || !slices.Equal(e.Shard()[0].Data, before) {
				t.Errorf("a non-finite step updated the weights (Adam step %d)", e.opt.Step)
			}
			if n := e.NonFinite(); n != 0 {
				t.Errorf("NonFinite after a refused step: %d, want 0", n)
			}
		})
	}
}

// TestOverflowOfLoss: a loss that is not finite (Overflow) is an fp16
// overflow like a gradient's: skipped with the scale halved, until the
// scale reaches its minimum, after which it is no longer Skipped.
func TestOverflowOfLoss(t *testing.T) {
	e, fill := newTestEngine(t, comm.Float16, ScalerConfig{InitialScale: 4, MinScale: 1})
	for _, want := range []struct {
		skipped bool
		scale   float64
	}{{true, 2}, {true, 1}, {false, 1}} {
		fill(0.01)
		res, err := e.Overflow()
		if err != nil {
			t.Fatal(err)
		}
		if !res.NonFinite || res.Skipped != want.skipped || e.LossScale() != want.scale || !math.IsNaN(res.Norm) {
			t.Fatalf("overflow: %+v, scale %g; want skipped %v, scale %g", res, e.LossScale(), want.skipped, want.scale)
		}
	}
}

// TestNonFiniteCountsWorkingParameters: fp16 working parameters that
// overflowed count although the fp32 master weights are finite.
func TestNonFiniteCountsWorkingParameters(t *testing.T) {
	e, _ := newTestEngine(t, comm.Float16, ScalerConfig{})
	if n := e.NonFinite(); n != 0 {
		t.Fatalf("fresh engine: %d non-finite values", n)
	}
	e.master[5] = 1e6 // finite in fp32, beyond fp16's 65504
	if err := e.publish(false); err != nil {
		t.Fatal(err)
	}
	if n := e.NonFinite(); n != 1 {
		t.Errorf("NonFinite with one fp16 weight out of range: %d, want 1", n)
	}
	e.opt.V[2] = float32(math.NaN())
	if n := e.NonFinite(); n != 2 {
		t.Errorf("NonFinite with a NaN moment too: %d, want 2", n)
	}
}

func sameFloat(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
