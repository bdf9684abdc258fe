package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/status"
)

// addMetricsFlag adds --metrics-addr.
func addMetricsFlag(f *pflag.FlagSet, o *RunOptions) {
	f.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on HOST:PORT/metrics while the job runs, e.g. :9400 (every interface) or 127.0.0.1:9400 (default: none); in per-node mode each node serves its own ranks")
}

// checkMetricsAddr refuses a bad --metrics-addr before anything starts.
func (o *RunOptions) checkMetricsAddr() error {
	if o.MetricsAddr == "" {
		return nil
	}
	return launch.ParseMetricsAddr(o.MetricsAddr)
}

// executeWithMetrics runs job with lo (the run's launch options and its
// planning hook) in its view, and with --metrics-addr serves its metrics
// for as long as it runs, its job info naming the layout e says.
func (o *RunOptions) executeWithMetrics(ctx context.Context, lo *LaunchOptions, job *launch.Job, e engineLaunch) error {
	if o.MetricsAddr == "" {
		return execute(ctx, lo, job, o.view(job))
	}
	world := len(job.RankInfos())
	layout := fmt.Sprintf("command, %d ranks", world)
	switch {
	case e.layout != nil && e.plan != nil:
		layout = "" // the planning hook names it for each attempt
	case e.spec != nil:
		layout = engineLayout(enginejob.ResolveDP(*e.spec, world))
	}
	exp, err := launch.ServeMetrics(o.MetricsAddr, job.RunID, layout, job.RankInfos())
	if err != nil {
		return err
	}
	e.layout.serve(exp)
	fmt.Fprintf(o.IO.Err, "gtrain: Prometheus metrics on http://%s/metrics\n", exp.Addr())
	return execute(ctx, lo, job, status.Multi(o.view(job), exp))
}

// engineLayout names the built-in engine's layout for gtrain_job_info,
// from the spec its ranks run (dp resolved: enginejob.ResolveDP), in
// ASCII, for users to match in PromQL.
func engineLayout(s train.Spec) string {
	p, b := s.Parallel, s.Batch
	return fmt.Sprintf("dp %d, tp %d, pp %d, ZeRO stage %d, micro_batch %d, grad_accum %d, %s",
		p.DP, max(p.TP, 1), max(p.PP, 1), p.ZeroStage, b.MicroBatch, max(b.GradAccum, 1), s.Precision)
}

// attemptLayout is the layout of the built-in engine's job as each
// attempt is planned (enginejob.PlanOptions.Layout), for the exporter:
// the planning hook learns it once the attempt's world is known (its
// hosts joined, --auto planned on their facts, an elastic restart
// refitted), which is after the exporter started. A nil *attemptLayout
// (a command's job) does nothing.
type attemptLayout struct {
	mu     sync.Mutex
	layout string
	exp    *launch.MetricsExporter
}

// planned names spec, which the ranks of the attempt planned now run.
func (l *attemptLayout) planned(spec train.Spec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.layout = engineLayout(spec)
	if l.exp != nil {
		l.exp.SetLayout(l.layout)
	}
}

// serve has exp name the layout planned from now on, and the one
// planned already, if any.
func (l *attemptLayout) serve(exp *launch.MetricsExporter) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exp = exp
	if l.layout != "" {
		exp.SetLayout(l.layout)
	}
}
