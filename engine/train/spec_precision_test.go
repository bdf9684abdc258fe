package train

import "testing"

// TestResolvedPrecision: every spelling comm.ParseDType accepts for the
// precision resolves to the one the trainer compares against ("fp16" turns
// on loss scaling, its checkpoint state and the overflow hint), so a job
// saying float16 or half trains exactly as one saying fp16.
func TestResolvedPrecision(t *testing.T) {
	for in, want := range map[string]string{
		"": "fp32", "fp32": "fp32", "float32": "fp32", "F32": "fp32",
		"bf16": "bf16", "bfloat16": "bf16", "BF16": "bf16",
		"fp16": "fp16", "float16": "fp16", "half": "fp16", "F16": "fp16",
	} {
		s := smallSpec(t.TempDir())
		s.Precision = in
		got, err := s.Resolved()
		if err != nil || got.Precision != want {
			t.Errorf("precision %q resolves to %q (%v), want %q", in, got.Precision, err, want)
		}
	}
}
