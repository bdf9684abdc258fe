package train

import "testing"

// TestCPUBackendPrecision: precision bf16 (either spelling) runs the
// matmuls on bfloat16 operands (backend.CPU.MatmulBF16), on the
// data-parallel path and the tp·pp > 1 path alike, which both build their
// backend with cpuBackend; fp32 and fp16 keep float32 matmuls. That the
// losses still track fp32 is TestMixedPrecisionTracksFP32's and
// TestGridMixedPrecisionTracksFP32's to check.
func TestCPUBackendPrecision(t *testing.T) {
	for prec, want := range map[string]bool{"bf16": true, "bfloat16": true, "fp32": false, "": false, "fp16": false} {
		s := Spec{Precision: prec, Threads: 3}
		if be := s.cpuBackend(Env{}); be.MatmulBF16 != want || be.Threads != 3 {
			t.Errorf("precision %q: backend %+v, want MatmulBF16 %v and 3 threads", prec, be, want)
		}
	}
}
