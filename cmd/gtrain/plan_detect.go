package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// addDetectFlags adds --detect and the SSH flags it reaches the hosts with.
func addDetectFlags(f *pflag.FlagSet, o *PlanOptions) {
	f.BoolVar(&o.Detect, "detect", false, "with --hostfile: plan for the hosts as they report themselves (gtrain's agents start there as for a run, detect GPUs, memory, CPUs and links, join and exit; unequal hosts are planned as the weakest, with a warning) instead of the hostfile's slots as catalog GPUs; starts no rank")
	addSSHFlags(f, &o.SSH)
}

// detect replaces the hostfile of a --detect plan by the cluster its hosts
// report (planner.TopologyOf their facts); the planner's warnings go to
// stderr. Without --detect it does nothing.
func (o *PlanOptions) detect(ctx context.Context) error {
	if !o.Detect {
		return nil
	}
	if o.Request.Hostfile == "" {
		return usage.Errorf("plan: --detect asks a hostfile's hosts what they are: give --hostfile")
	}
	r := launch.Request{Hostfile: o.Request.Hostfile, SSH: o.SSH, NprocPerNode: 1, Getenv: o.IO.Getenv, JoinTimeout: 60 * time.Second}
	hosts, err := r.DetectHosts(ctx, o.IO.Err)
	if err != nil {
		return err
	}
	top, warns, err := planner.TopologyOf(hosts)
	for _, w := range warns {
		fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", w)
	}
	if err != nil {
		return fmt.Errorf("plan --detect: %w", err)
	}
	o.Request.Hostfile, o.Request.Detected = "", &top
	return nil
}
