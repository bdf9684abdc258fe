package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/engine/train"
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
	fmt.Fprintln(o.IO.Err, autoLine(choice))
	return spec, nil
}

// autoLine is the one line --auto prints: the layout (with the layers of
// each pipeline stage), the batch split, and the planner's prediction for
// the most loaded rank, by category, and for the step.
func autoLine(choice train.AutoChoice) string {
	c, m := choice.Candidate, choice.Memory
	layers := ""
	if c.PP > 1 {
		s := make([]string, len(choice.Split))
		for i, n := range choice.Split {
			s[i] = strconv.Itoa(n)
		}
		layers = " (layers " + strings.Join(s, ",") + ")"
		if c.Chunks() > 1 {
			layers = fmt.Sprintf(" virtual_stages=%d (layers per virtual stage %s)", c.Chunks(), strings.Join(s, ","))
		}
	}
	size := func(b float64) string { return formatSize(int64(b)) }
	return fmt.Sprintf("gtrain: --auto: tp=%d pp=%d%s dp=%d zero=%d micro_batch=%d grad_accum=%d recompute=%s, the job's global batch of %d sequences "+
		"(predicted %s of %s per rank: params %s, grads %s, optimizer %s, activations %s, buffers %s; %s per step)",
		c.TP, c.PP, layers, c.DP, c.ZeroStage, c.MicroBatch, c.GradAccum, c.Recompute, choice.GlobalBatch,
		size(m.Total), size(choice.Usable), size(m.Params), size(m.Grads), size(m.Optimizer), size(m.Activations), size(m.Buffers), seconds(c.StepTime))
}
