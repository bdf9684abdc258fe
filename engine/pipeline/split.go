package pipeline

import (
	"fmt"

	"github.com/gtrain/gtrain/planner"
)

// Split returns the layers of each of stages (virtual) stages, in stage
// order: explicit when it is given (Megatron-LM-style, one count per stage:
// parallel.pp_layers), else the planner's split (planner.StageLayers), so
// that the engine runs the split the planner costs. An explicit split must
// have one count per stage, each at least 1, adding up to layers.
func Split(layers, stages int, explicit []int) ([]int, error) {
	if stages < 1 || stages > layers || stages > MaxStages*MaxChunks {
		return nil, fmt.Errorf("pipeline: split %d layers over %d stages: want 1 to %d stages, each with a layer at least",
			layers, stages, min(layers, MaxStages*MaxChunks))
	}
	if len(explicit) == 0 {
		return planner.StageLayers(layers, stages), nil
	}
	if len(explicit) != stages {
		return nil, fmt.Errorf("pipeline: pp_layers %v: %d counts for %d stages: give one count per stage", explicit, len(explicit), stages)
	}
	sum := 0
	for i, n := range explicit {
		if n < 1 || n > layers {
			return nil, fmt.Errorf("pipeline: pp_layers %v: stage %d has %d layers: every stage needs 1 to %d", explicit, i, n, layers)
		}
		sum += n
	}
	if sum != layers {
		return nil, fmt.Errorf("pipeline: pp_layers %v: adds up to %d layers, not the model's %d: make the counts sum to %d", explicit, sum, layers, layers)
	}
	return append([]int(nil), explicit...), nil
}

// Layers returns the first layer of virtual stage stage and the one after
// its last, in a split Split returned.
func Layers(split []int, stage int) (first, end int) {
	for _, n := range split[:stage] {
		first += n
	}
	return first, first + split[stage]
}
