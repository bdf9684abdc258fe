package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
)

// autoLayout is `gtrain run --auto`: it lays out the job for the run's
// ranks with the planner (train.AutoLayout) and prints the choice on
// stderr. Without --auto it returns spec unchanged. On several hosts (a
// hostfile, --hosts, a Slurm allocation) the layout is decided once their
// agents have joined, from what each reported (enginejob.PlanOptions.Auto):
// this machine may be nothing like them, so its facts decide nothing
// there, and a dry run, which starts no agent, only previews from them
// (previewLayout).
func (o *RunOptions) autoLayout(ctx context.Context, spec train.Spec) (train.Spec, error) {
	if !o.Auto {
		return spec, nil
	}
	nodes, _, err := o.Nodes(ctx, o.NprocPerNode)
	if err != nil {
		return spec, err
	}
	if o.autoFromFacts() {
		return o.previewLayout(spec, nodes)
	}
	spec, choice, err := train.AutoLayout(spec, nodes)
	if err != nil {
		return spec, err
	}
	fmt.Fprintln(o.IO.Err, autoLine(choice))
	return spec, nil
}

// autoFromFacts says that --auto lays the job out from the facts the
// hosts' agents report: on every source of several hosts (a hostfile,
// --hosts, a Slurm allocation), where launchEngine gives the launch
// enginejob's planner. The launcher may run on none of them (a login node,
// the batch script's first node with less memory than the others).
func (o *RunOptions) autoFromFacts() bool { return o.Auto && o.MultiHost() }

// previewLayout is --auto on several hosts before any agent reports:
// spec unchanged, once its global batch is known to fit the hosts' ranks
// (that needs no facts, so it fails now rather than once the hosts have
// joined). A dry run shows the layout this machine's facts would give,
// saying that they are this machine's; a layout that does not fit here is
// a note, not a refusal, since the run does not plan from here.
func (o *RunOptions) previewLayout(spec train.Spec, nodes []hostfiles.Node) (train.Spec, error) {
	ranks := 0
	for _, n := range nodes {
		ranks += len(n.SlotIDs)
	}
	if _, err := train.GlobalBatch(spec, ranks); err != nil || !o.DryRun {
		return spec, err
	}
	const from = "gtrain: --auto: the run plans from what each host's agent reports when it joins; this dry run starts none and previews as if every host were this machine:"
	laid, choice, err := train.AutoLayout(spec, nodes)
	if err != nil {
		fmt.Fprintf(o.IO.Err, "%s %v\n", from, err)
		return spec, nil
	}
	fmt.Fprintf(o.IO.Err, "%s\n%s\n", from, autoLine(choice))
	return laid, nil
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
