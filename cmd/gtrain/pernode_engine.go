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
// to form a job unless its digest is the same on all of them. Node 0's
// launcher records that digest in the run directory, or refuses one that
// holds another job's run (enginejob.PerNodePlanner); rank 0, on node 0,
// locks the directory and writes metrics.jsonl there, and checks that
// every node's ranks see it (the engine's shared-directory probe), as on
// a hostfile's hosts. The ranks resume from the job's newest checkpoint
// if it has one: a scheduler that starts every node again (a Kubernetes
// pod restarted) runs the same command, which must then continue the job
// rather than refuse its own directory. A restart (--max-restarts)
// resumes likewise, and with
// --nnodes MIN:MAX on the world of the attempt with the global batch the
// job started with (enginejob's planner, Runtime.Plan, on every node: the
// rounds carry its state to a node that joins at a restart).

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
	lo := o.LaunchOptions // a copy: the planning hook is this job's, not a flag's
	layout := &attemptLayout{}
	lo.Plan = j.PerNodePlanner(enginejob.PlanOptions{Layout: layout.planned})
	w := launch.Workload{Command: j.Command, Env: j.Env, Digest: j.Digest()}
	return o.perNodeRun(ctx, &lo, w, layout)
}

// checkPerNodeEngine refuses what per-node mode does not do for the
// built-in engine: --auto, which lays the job out from the hosts' facts,
// which no node has of the others.
func (o *RunOptions) checkPerNodeEngine() error {
	if _, _, _, err := o.CheckPerNode(); err != nil {
		return err
	}
	if o.Auto {
		return usage.Errorf("run: --auto is not available in per-node mode: give the layout with --set parallel.tp=..., parallel.pp=..., or run --auto with --hostfile")
	}
	return nil
}

// perNodeRun runs this node's part of the per-node job whose ranks run w,
// with lo (the run's launch options and its planning hook), and with
// --metrics-addr serves this node's ranks for as long as it runs, its job
// info naming the layout each attempt is planned with (layout: the
// built-in engine's; nil for a command).
func (o *RunOptions) perNodeRun(ctx context.Context, lo *LaunchOptions, w launch.Workload, layout *attemptLayout) error {
	var view status.View = status.NewLines(o.IO.Out, o.IO.Err, true)
	if o.Output == "json" {
		view = status.NewJSON(o.IO.Out)
	}
	if o.MetricsAddr != "" {
		// Each node serves the ranks it runs, as each pod is its own
		// scrape target; the job's info is the same on every node.
		// The engine's layout is known once the nodes met and the
		// attempt is planned: until then the job's info is not served.
		info := ""
		if layout == nil {
			info = "command, per node"
		}
		exp, err := launch.ServeMetrics(o.MetricsAddr, o.RunID, info, nil)
		if err != nil {
			return err
		}
		layout.serve(exp)
		fmt.Fprintf(o.IO.Err, "gtrain: Prometheus metrics on http://%s/metrics (this node's ranks)\n", exp.Addr())
		view = status.Multi(view, exp)
	}
	err := lo.RunPerNode(ctx, w, view, o.Signals.abort)
	return endView(view, err)
}
