package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/launch/status"
)

// NewCmdRuns is `gtrain runs`, the parent of show.
func NewCmdRuns(ios *IOStreams) *cobra.Command {
	return newGroup("runs", "Look at the built-in engine's runs", `Every run of the built-in engine keeps its metrics in its run directory (the
job's checkpoint.dir, by default runs/<start time>/): metrics.jsonl, one JSON
status record per step.`, NewCmdRunsShow(ios))
}

// RunsShowOptions are the inputs of `gtrain runs show`.
type RunsShowOptions struct {
	IO     *IOStreams
	Dir    string
	Output string // text or json
}

// NewCmdRunsShow is `gtrain runs show`.
func NewCmdRunsShow(ios *IOStreams) *cobra.Command {
	o := &RunsShowOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "show DIR",
		Short: "Summarise a run and chart its loss and validation loss over steps",
		Long: `Summarise the run in DIR (a run directory: the job's checkpoint.dir) from its
metrics.jsonl: layout, steps, the last loss and validation loss, tokens/s and
time; then a chart of the training loss (•) and the validation loss (o) over
the steps. With --output json: the summary and the series of every step.`,
		Example: `  gtrain runs show runs/20250301-120000
  gtrain runs show runs/20250301-120000 -o json | jq '.series[-1]'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Dir = args[0]
			return runsShowRun(cmd.Context(), o)
		},
	}
	addOutputFlag(cmd.Flags(), &o.Output, "the summary and the series of every step")
	return cmd
}

// runsShowRun prints the summary of o.Dir.
func runsShowRun(ctx context.Context, o *RunsShowOptions) error {
	s, err := summarizeRun(ctx, o.Dir)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		return writeJSON(o.IO.Out, s)
	}
	_, err = fmt.Fprint(o.IO.Out, runSummaryText(s)+"\n"+status.Chart(lossSeries(s), "step", 72, 14))
	return err
}

// summarizeRun is train.SummarizeRun(dir), or ctx's cause as soon as ctx
// ends: reading ten million steps takes a while, and a manifest that is a
// FIFO blocks its open(2) where no context reaches. The reader left behind
// ends with the process, which is what an interrupted command does next.
func summarizeRun(ctx context.Context, dir string) (train.RunSummary, error) {
	type result struct {
		s   train.RunSummary
		err error
	}
	done := make(chan result, 1) // buffered: an abandoned reader does not block
	go func() {
		s, err := train.SummarizeRun(dir)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		return train.RunSummary{}, context.Cause(ctx)
	}
}

// runSummaryText is the summary's lines.
func runSummaryText(s train.RunSummary) string {
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%-11s %s\n", k+":", v) }
	line("run", s.Dir)
	if s.Layout != "" {
		line("layout", s.Layout)
	}
	line("steps", fmt.Sprintf("%d of %d", s.LastStep, s.Steps))
	line("loss", fmt.Sprintf("%.4f at step %d", s.Loss, s.LastStep))
	if s.ValLoss != nil {
		line("val loss", fmt.Sprintf("%.4f at step %d", *s.ValLoss, s.ValStep))
	}
	line("tokens/s", fmt.Sprintf("%.0f (mean of the steps)", s.TokensPerS))
	line("time", fmt.Sprintf("%s training, %s wall", runDuration(s.TrainSeconds), runDuration(s.WallSeconds)))
	return b.String()
}

func runDuration(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// lossSeries are the chart's series: the training loss of every step and
// the validation loss where it was evaluated.
func lossSeries(s train.RunSummary) []status.ChartSeries {
	loss := status.ChartSeries{Name: "train loss", Glyph: '•'}
	val := status.ChartSeries{Name: "val loss", Glyph: 'o'}
	for _, p := range s.Series {
		loss.X, loss.Y = append(loss.X, float64(p.Step)), append(loss.Y, float64(p.Loss))
		if p.ValLoss != nil {
			val.X, val.Y = append(val.X, float64(p.Step)), append(val.Y, float64(*p.ValLoss))
		}
	}
	if len(val.X) == 0 {
		return []status.ChartSeries{loss}
	}
	return []status.ChartSeries{loss, val}
}
