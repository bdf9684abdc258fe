package enginejob

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// PlanOptions say how Job.Planner lays the job out for each attempt.
type PlanOptions struct {
	// Auto re-plans tp, pp, dp and the batch split with the planner on the
	// hosts' reported facts (run --auto on a hostfile's hosts).
	Auto bool
	// Line is --auto's line for a layout chosen from the hosts' facts,
	// shown as a note; nil shows none.
	Line func(train.AutoChoice) string
}

// Planner is the launcher's planning hook (launch.Runtime.Plan) for j:
// once every host of an attempt has joined, it gives every rank the spec
// laid out for that attempt's world. The global batch is the one of the
// first attempt's world and stays, so an elastic restart on fewer or more
// hosts trains on as the uninterrupted job would: dp is recomputed
// (train.Refit), or with o.Auto the whole layout re-planned for the hosts
// that joined (train.AutoLayoutOn). Attempts on the job's own world
// without o.Auto keep the spec the ranks already have.
func (j *Job) Planner(o PlanOptions) func(context.Context, launch.World) (launch.Planned, error) {
	global, first := 0, 0
	return func(_ context.Context, w launch.World) (launch.Planned, error) {
		var pl launch.Planned
		if global == 0 {
			g, err := train.GlobalBatch(j.Spec, w.Size)
			if err != nil {
				return pl, err
			}
			global, first = g, w.Size
		}
		spec, err := j.specFor(o, w, global, first, &pl.Notes)
		if err != nil || spec == nil {
			return pl, err
		}
		js, err := json.Marshal(spec)
		if err != nil {
			return pl, fmt.Errorf("run: encode the job for attempt %d: %w", w.Attempt, err)
		}
		pl.Env = []string{rankenv.JobSpec + "=" + string(js)}
		return pl, nil
	}
}

// specFor is j's spec laid out for the world w, or nil where the ranks'
// spec stands as it is; it adds what the user should know to notes.
func (j *Job) specFor(o PlanOptions, w launch.World, global, first int, notes *[]string) (*train.Spec, error) {
	if o.Auto {
		if hosts, ok := reported(w.Facts); ok {
			top, warns, err := planner.CPUTopologyOf(hosts, w.Slots)
			if err != nil {
				return nil, fmt.Errorf("run --auto: the hosts' reported facts: %w", err)
			}
			spec, choice, err := train.AutoLayoutOn(j.Spec, top, global)
			if err != nil {
				return nil, err
			}
			*notes = append(*notes, warns...)
			if o.Line != nil {
				*notes = append(*notes, "from the hosts' reported facts: "+o.Line(choice))
			}
			return &spec, nil
		}
	}
	if w.Size == first {
		return nil, nil
	}
	spec, err := train.Refit(j.Spec, w.Size, global)
	if err != nil {
		return nil, err
	}
	p := spec.Parallel
	*notes = append(*notes, fmt.Sprintf("attempt %d runs on %d ranks: tp %d × pp %d × dp %d, micro_batch %d × grad_accum %d, the global batch stays %d sequences",
		w.Attempt, w.Size, max(p.TP, 1), max(p.PP, 1), p.DP, spec.Batch.MicroBatch, spec.Batch.GradAccum, global))
	return &spec, nil
}

// reported is the hosts' facts when every agent reported some.
func reported(facts []*hostinfo.Host) ([]hostinfo.Host, bool) {
	if len(facts) == 0 || slices.Contains(facts, nil) {
		return nil, false
	}
	hosts := make([]hostinfo.Host, len(facts))
	for i, h := range facts {
		hosts[i] = *h
	}
	return hosts, true
}
