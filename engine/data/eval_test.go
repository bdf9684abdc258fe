package data

import (
	"strings"
	"testing"
)

func TestEvalBatches(t *testing.T) {
	tests := []struct {
		name               string
		n, batch, seq, max int
		wantLen            int
	}{
		{"exact fit", 2*3*4 + 1, 2, 4, 0, 3},
		{"remainder dropped", 2*3*4 + 5, 2, 4, 0, 3},
		{"limited", 2*3*4 + 1, 2, 4, 2, 2},
		{"limit above size", 2*3*4 + 1, 2, 4, 10, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := EvalBatches(ramp(tt.n), tt.batch, tt.seq, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if e.Len() != tt.wantLen {
				t.Fatalf("Len = %d, want %d", e.Len(), tt.wantLen)
			}
			x, y := make([]int32, tt.batch*tt.seq), make([]int32, tt.batch*tt.seq)
			// Consecutive windows: batch i holds tokens i*B*T onwards.
			for i := range e.Len() {
				if err := e.Batch(i, x, y); err != nil {
					t.Fatal(err)
				}
				for j := range x {
					if want := int32(i*tt.batch*tt.seq + j); x[j] != want || y[j] != want+1 {
						t.Fatalf("batch %d at %d: x, y = %d, %d; want %d, %d", i, j, x[j], y[j], want, want+1)
					}
				}
			}
			if err := e.Batch(e.Len(), x, y); err == nil {
				t.Error("Batch(Len) succeeded")
			}
			if err := e.Batch(0, x[:1], y); err == nil {
				t.Error("Batch with a short buffer succeeded")
			}
		})
	}
}

func TestEvalBatchesErrors(t *testing.T) {
	short := NewTokens(make([]uint16, 8))
	short.name = "val.bin"
	tests := []struct {
		name       string
		src        *Tokens
		batch, seq int
		want       string
	}{
		{"no tokens", nil, 1, 1, "no tokens"},
		{"zero batch", short, 0, 4, "batch size 0"},
		{"too short", short, 2, 4, "data: val.bin: 8 tokens, too few for one evaluation batch of 2 x 4: need at least 9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := EvalBatches(tt.src, tt.batch, tt.seq, 0)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("EvalBatches = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
