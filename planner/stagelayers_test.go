package planner

import (
	"slices"
	"testing"
)

// TestStageLayers pins the split the planner costs and the engine runs:
// as even as possible, the extra layers on the last stages.
func TestStageLayers(t *testing.T) {
	for _, tc := range []struct {
		layers, stages int
		want           []int
	}{
		{12, 1, []int{12}},
		{12, 4, []int{3, 3, 3, 3}},
		{10, 4, []int{2, 2, 3, 3}},
		{7, 3, []int{2, 2, 3}},
		{5, 4, []int{1, 1, 1, 2}},
		{2, 3, []int{0, 1, 1}},
		{4, 0, nil},
	} {
		if got := StageLayers(tc.layers, tc.stages); !slices.Equal(got, tc.want) {
			t.Errorf("StageLayers(%d, %d) = %v, want %v", tc.layers, tc.stages, got, tc.want)
		}
	}
}

// TestStageOfUsesStageLayers: every stage the cost model evaluates has the
// layers StageLayers gives it, and the split adds up.
func TestStageOfUsesStageLayers(t *testing.T) {
	checked := 0
	for layers := 1; layers <= 13; layers++ {
		for p := 1; p <= layers; p++ {
			split := StageLayers(layers, p)
			sum := 0
			for i, want := range split {
				sum += want
				if got := stageOf(Model{Layers: layers, Hidden: 64, Heads: 4, KVHeads: 4, Vocab: 100, Seq: 16}, i, p, 1).layers; got != want {
					t.Errorf("layers %d pp %d: stageOf(%d) has %d layers, StageLayers %d", layers, p, i, got, want)
				}
				checked++
			}
			if sum != layers || slices.Max(split)-slices.Min(split) > 1 {
				t.Errorf("StageLayers(%d, %d) = %v: want %d layers split within one of each other", layers, p, split, layers)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no stage checked")
	}
}
