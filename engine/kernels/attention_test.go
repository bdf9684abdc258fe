package kernels

import (
	"fmt"
	"slices"
	"testing"
)

// attnShapes covers T=1, a single head, odd head sizes and T across one
// and two attnBlock boundaries.
var attnShapes = []struct{ B, T, C, NH int }{
	{1, 1, 4, 1},
	{2, 5, 6, 2},
	{1, 7, 9, 3},
	{2, 3, 5, 1},
	{2, attnBlock + 3, 8, 2},
	{1, 2*attnBlock + 5, 12, 4},
}

func TestAttentionForward(t *testing.T) {
	r := newRand(10)
	for _, s := range attnShapes {
		t.Run(fmt.Sprintf("B%dT%dC%dNH%d", s.B, s.T, s.C, s.NH), func(t *testing.T) {
			qkv := randSlice(r, s.B*s.T*3*s.C, 2)
			out := filled(s.B*s.T*s.C, 7) // overwritten, not accumulated
			att := filled(s.B*s.NH*s.T*s.T, 7)
			AttentionForward(1, out, att, qkv, s.B, s.T, s.C, s.NH)
			wantOut, wantAtt := refAttention(qkv, s.B, s.T, s.C, s.NH)
			assertClose(t, "out", out, wantOut, 1e-6, 1e-5)
			// The reference leaves the masked entries 0, so this also
			// checks the kernel cleared them.
			assertClose(t, "att", att, wantAtt, 1e-7, 1e-5)
		})
	}
}

// TestAttentionBackward checks every coordinate of the gradient against a
// float64 reference (the gradient check samples coordinates of the larger
// shapes).
func TestAttentionBackward(t *testing.T) {
	r := newRand(11)
	for _, s := range attnShapes {
		t.Run(fmt.Sprintf("B%dT%dC%dNH%d", s.B, s.T, s.C, s.NH), func(t *testing.T) {
			qkv, dout := randSlice(r, s.B*s.T*3*s.C, 2), randSlice(r, s.B*s.T*s.C, 1)
			out, att := make([]float32, s.B*s.T*s.C), make([]float32, s.B*s.NH*s.T*s.T)
			AttentionForward(1, out, att, qkv, s.B, s.T, s.C, s.NH)
			dqkv := make([]float32, len(qkv))
			AttentionBackward(1, dqkv, dout, qkv, att, make([]float32, AttentionScratch(1, s.T)), s.B, s.T, s.C, s.NH)
			_, refAtt := refAttention(qkv, s.B, s.T, s.C, s.NH)
			assertClose(t, "dqkv", dqkv, refAttentionBackward(qkv, refAtt, dout, s.B, s.T, s.C, s.NH), 1e-5, 1e-4)
		})
	}
}

func TestAttentionScratchTooSmall(t *testing.T) {
	B, T, C, NH := 1, 4, 4, 1
	defer func() {
		if recover() == nil {
			t.Error("AttentionBackward with a short scratch did not panic")
		}
	}()
	AttentionBackward(1, make([]float32, B*T*3*C), make([]float32, B*T*C), make([]float32, B*T*3*C),
		make([]float32, B*NH*T*T), make([]float32, T*T-1), B, T, C, NH)
}

// TestAttentionBF16: with its matmuls on bfloat16 operands, attention stays
// within bfloat16's precision (8 significant bits, a few roundings per
// value) of the float64 reference, forward and backward, and differs from
// the float32 kernels' results (the rounding is in effect).
func TestAttentionBF16(t *testing.T) {
	r := newRand(12)
	for _, s := range attnShapes[4:] {
		t.Run(fmt.Sprintf("B%dT%dC%dNH%d", s.B, s.T, s.C, s.NH), func(t *testing.T) {
			qkv, dout := randSlice(r, s.B*s.T*3*s.C, 2), randSlice(r, s.B*s.T*s.C, 1)
			out, att := make([]float32, s.B*s.T*s.C), make([]float32, s.B*s.NH*s.T*s.T)
			AttentionForwardBF16(1, out, att, qkv, s.B, s.T, s.C, s.NH)
			wantOut, wantAtt := refAttention(qkv, s.B, s.T, s.C, s.NH)
			assertClose(t, "out", out, wantOut, 2e-2, 2e-2)
			assertClose(t, "att", att, wantAtt, 1e-2, 2e-2)
			dqkv := make([]float32, len(qkv))
			AttentionBackwardBF16(1, dqkv, dout, qkv, att, make([]float32, AttentionScratch(1, s.T)), s.B, s.T, s.C, s.NH)
			assertClose(t, "dqkv", dqkv, refAttentionBackward(qkv, wantAtt, dout, s.B, s.T, s.C, s.NH), 3e-2, 3e-2)

			out32, att32 := make([]float32, len(out)), make([]float32, len(att))
			AttentionForward(1, out32, att32, qkv, s.B, s.T, s.C, s.NH)
			dqkv32 := make([]float32, len(qkv))
			AttentionBackward(1, dqkv32, dout, qkv, att32, make([]float32, AttentionScratch(1, s.T)), s.B, s.T, s.C, s.NH)
			if slices.Equal(out, out32) || slices.Equal(dqkv, dqkv32) {
				t.Error("the bf16 attention gave the float32 results: its operands were not rounded")
			}
		})
	}
}
