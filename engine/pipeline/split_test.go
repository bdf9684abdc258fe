package pipeline

import (
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct{ layers, stages int }{{12, 1}, {12, 4}, {10, 4}, {7, 3}, {5, 5}} {
		got, err := Split(tc.layers, tc.stages, nil)
		if err != nil || !slices.Equal(got, planner.StageLayers(tc.layers, tc.stages)) {
			t.Errorf("Split(%d, %d) = %v, %v; the planner splits %v", tc.layers, tc.stages, got, err, planner.StageLayers(tc.layers, tc.stages))
		}
	}
	explicit := []int{5, 4, 3}
	got, err := Split(12, 3, explicit)
	if err != nil || !slices.Equal(got, []int{5, 4, 3}) {
		t.Fatalf("explicit split: %v, %v", got, err)
	}
	explicit[0] = 99
	if got[0] != 5 {
		t.Error("Split returned the caller's slice")
	}
	for i, want := range [][2]int{{0, 5}, {5, 9}, {9, 12}} {
		if first, end := Layers(got, i); first != want[0] || end != want[1] {
			t.Errorf("Layers(%v, %d) = %d, %d, want %v", got, i, first, end, want)
		}
	}
}

func TestSplitErrors(t *testing.T) {
	for _, tc := range []struct {
		layers, stages int
		explicit       []int
		want           string
	}{
		{12, 0, nil, "want 1 to 12 stages"},
		{3, 4, nil, "want 1 to 3 stages"},
		{12, 3, []int{6, 6}, "2 counts for 3 stages"},
		{12, 3, []int{6, 6, 0}, "stage 2 has 0 layers"},
		{12, 3, []int{6, -1, 7}, "stage 1 has -1 layers"},
		{12, 3, []int{4, 4, 5}, "adds up to 13 layers, not the model's 12"},
	} {
		_, err := Split(tc.layers, tc.stages, tc.explicit)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "pipeline: ") {
			t.Errorf("Split(%d, %d, %v) = %v, want %q", tc.layers, tc.stages, tc.explicit, err, tc.want)
		}
	}
}
