package main

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/planner"
)

// autoLayout is `gtrain run --auto`: it lays out the job for the run's
// ranks with the planner (train.AutoLayout) and prints the choice on
// stderr. Without --auto it returns spec unchanged.
func (o *RunOptions) autoLayout(ctx context.Context, spec train.Spec) (train.Spec, error) {
	if !o.Auto {
		return spec, nil
	}
	nodes, _, err := o.Nodes(ctx, o.NprocPerNode)
	if err != nil {
		return spec, err
	}
	spec, choice, err := train.AutoLayout(spec, nodes)
	if err != nil {
		return spec, err
	}
	b := choice.Candidate
	fmt.Fprintf(o.IO.Err, "gtrain: --auto: dp=%d zero=%d micro_batch=%d grad_accum=%d recompute=%s, the job's global batch of %d sequences (predicted %s of %s per rank, %s per step)\n",
		b.DP, b.ZeroStage, b.MicroBatch, b.GradAccum, b.Recompute, choice.GlobalBatch, planner.GiB(b.Memory.Total), planner.GiB(choice.Usable), seconds(b.StepTime))
	return spec, nil
}
