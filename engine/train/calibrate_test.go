package train

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// TestMeasureCPU: the measured figures are finite and positive, and far
// from zero (a unit slip would be orders of magnitude off). They are
// logged: `go test -run TestMeasureCPU -v ./engine/train` on a quiet
// machine gives planner.DefaultCPUSpeed's GEMM and kernel figures.
func TestMeasureCPU(t *testing.T) {
	start := time.Now()
	s := MeasureCPU()
	t.Logf("took %v", time.Since(start))
	t.Logf("GEMM %.1f GFLOP/s per core, memory-bound kernels %.2f GB/s per core", s.GEMMFLOPSPerCore/1e9, s.KernelBytesPerSecPerCore/1e9)
	for _, v := range []struct {
		name     string
		got, min float64
	}{{"GEMM FLOP/s", s.GEMMFLOPSPerCore, 1e8}, {"kernel bytes/s", s.KernelBytesPerSecPerCore, 1e7}} {
		if math.IsNaN(v.got) || math.IsInf(v.got, 0) || v.got < v.min {
			t.Errorf("%s: %g, want a finite figure above %g", v.name, v.got, v.min)
		}
	}
}

// TestPredictLayout: the prediction is for the job's own layout, with the
// job's micro-batches per step; a layout that is not the run's ranks is
// refused as a usage error naming the degrees.
func TestPredictLayout(t *testing.T) {
	spec := DefaultSpec()
	spec.Model = ModelSpec{Preset: "small"}
	spec.Batch = BatchSpec{MicroBatch: 2, GradAccum: 4}
	spec.Parallel.TP, spec.Parallel.PP = 2, 2
	top := planner.CPUTopology([]int{4}, 16<<30, 2)
	c, err := PredictLayout(spec, top)
	if err != nil {
		t.Fatal(err)
	}
	if c.TP != 2 || c.PP != 2 || c.DP != 1 || c.MicroBatch != 2 || c.GradAccum != 4 || !c.Feasible || !(c.StepTime > 0) {
		t.Errorf("got tp %d pp %d dp %d, micro-batch %d × %d, feasible %v (%s), step %g s; want tp 2 pp 2 dp 1, 2 × 4, a feasible step",
			c.TP, c.PP, c.DP, c.MicroBatch, c.GradAccum, c.Feasible, c.RejectReason, c.StepTime)
	}
	spec.Parallel.DP = 2
	_, err = PredictLayout(spec, top)
	var u *usage.Error
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "tp 2 × pp 2 × dp 2 is not the 4 ranks") {
		t.Errorf("dp 2 on 4 ranks of tp 2 × pp 2: %v, want a usage error naming the degrees", err)
	}
}
