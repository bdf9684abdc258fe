package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/engine/train"
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
// planning hook) in its view, and with --metrics-addr serves its metrics,
// layout naming it in their job info, for as long as it runs.
func (o *RunOptions) executeWithMetrics(ctx context.Context, lo *LaunchOptions, job *launch.Job, layout string) error {
	if o.MetricsAddr == "" {
		return execute(ctx, lo, job, o.view(job))
	}
	if layout == "" {
		layout = fmt.Sprintf("command, %d ranks", len(job.RankInfos()))
	}
	exp, err := launch.ServeMetrics(o.MetricsAddr, job.RunID, layout, job.RankInfos())
	if err != nil {
		return err
	}
	fmt.Fprintf(o.IO.Err, "gtrain: Prometheus metrics on http://%s/metrics\n", exp.Addr())
	return execute(ctx, lo, job, status.Multi(o.view(job), exp))
}

// engineLayout names the built-in engine's layout for gtrain_job_info.
func engineLayout(s train.Spec) string {
	p := s.Parallel
	return fmt.Sprintf("dp %d, tp %d, pp %d, ZeRO stage %d, %s", p.DP, max(p.TP, 1), max(p.PP, 1), p.ZeroStage, s.Precision)
}
