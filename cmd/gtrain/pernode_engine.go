package main

import (
	"context"
	"fmt"

	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/status"
)

// The built-in engine in per-node mode: every node prepares the same job
// from its own flags and files (enginejob.Fresh with PerNode: nothing is
// claimed here, the run directory is runs/<rdzv-id>), and the nodes refuse
// to form a job unless its digest is the same on all of them. Rank 0, on
// node 0, creates and locks the checkpoint directory and writes
// metrics.jsonl there, and checks that every node's ranks see that
// directory (the engine's shared-directory probe), as on a hostfile's
// hosts. A restart resumes from the newest checkpoint as there.

// runPerNodeEngine runs this node's ranks of a per-node job of the
// built-in engine.
func (o *RunOptions) runPerNodeEngine(ctx context.Context) error {
	if err := o.checkPerNodeEngine(); err != nil {
		return err
	}
	dir, err := o.WorkDir()
	if err != nil {
		return err
	}
	eo := o.engineOptions()
	eo.Job, eo.Sets, eo.Dir, eo.PerNode = o.Job, o.Sets, dir, true
	j, err := enginejob.Fresh(ctx, eo)
	if err != nil {
		return err
	}
	defer j.Release()
	o.sayEngine(j)
	w := launch.Workload{Command: j.Command, Env: j.Env, Digest: j.Digest()}
	return o.perNodeRun(ctx, w, engineLayout(j.Spec))
}

// checkPerNodeEngine refuses what per-node mode does not do for the
// built-in engine: --auto, which lays the job out for hosts no node
// knows before the nodes meet, and --nnodes MIN:MAX, since a node that
// joins only at a restart would lay the job out for the world it first
// sees, not the global batch the job started with.
func (o *RunOptions) checkPerNodeEngine() error {
	lo, hi, _, err := o.CheckPerNode()
	switch {
	case err != nil:
		return err
	case o.Auto:
		return usage.Errorf("run: --auto is not available in per-node mode: give the layout with --set parallel.tp=..., parallel.pp=..., or run --auto with --hostfile")
	case lo != hi:
		return usage.Errorf("run: --nnodes %s: the built-in engine runs per node on a fixed number of nodes (--nnodes %d); elastic engine jobs run with --hostfile", o.NNodes, hi)
	}
	return nil
}

// perNodeRun runs this node's part of the per-node job whose ranks run w,
// with --metrics-addr serving this node's ranks (layout naming the job in
// gtrain_job_info) for as long as it runs.
func (o *RunOptions) perNodeRun(ctx context.Context, w launch.Workload, layout string) error {
	var view status.View = status.NewLines(o.IO.Out, o.IO.Err, true)
	if o.Output == "json" {
		view = status.NewJSON(o.IO.Out)
	}
	if o.MetricsAddr != "" {
		// Each node serves the ranks it runs, as each pod is its own
		// scrape target; the job's info is the same on every node.
		exp, err := launch.ServeMetrics(o.MetricsAddr, o.RunID, layout, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.IO.Err, "gtrain: Prometheus metrics on http://%s/metrics (this node's ranks)\n", exp.Addr())
		view = status.Multi(view, exp)
	}
	err := o.RunPerNode(ctx, w, view, o.Signals.abort)
	return endView(view, err)
}
