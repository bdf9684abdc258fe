package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/commbench"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// NewCmdBench is `gtrain bench`, the parent of the benchmarks.
func NewCmdBench(ios *IOStreams, sig *signals) *cobra.Command {
	return newGroup("bench", "Measure gtrain's building blocks on a cluster", "", NewCmdBenchCollectives(ios, sig))
}

// BenchOptions are the inputs of `gtrain bench collectives`.
type BenchOptions struct {
	Launch LaunchOptions // where the ranks run
	commbench.Flags
	Output string // text or json
}

// NewCmdBenchCollectives is `gtrain bench collectives`.
func NewCmdBenchCollectives(ios *IOStreams, sig *signals) *cobra.Command {
	o := &BenchOptions{Launch: newLaunchOptions(ios, sig)}
	cmd := &cobra.Command{
		Use:   "collectives [flags]",
		Short: "Time the built-in collectives across the ranks of a job, nccl-tests style",
		Long: `Time the built-in collective library (engine/comm) across the ranks of a job:
for each collective and message size, the median, minimum and maximum time
over the iterations after a warm-up (each iteration as long as its slowest
rank), the algorithm bandwidth (size/time) and bus bandwidth (nccl-tests'
definitions), and the number of wrong elements in a checked run. As in
nccl-tests, the iterations run back to back on the same buffers (an
in-place sum keeps growing); the checked run starts from fresh input.

Without a hostfile it starts --nproc-per-node ranks on this machine (default
2); with --hostfile, one rank per slot on every host, as gtrain run does.
Run under gtrain run (gtrain run ... -- gtrain bench collectives ...), each
rank measures instead of launching. Sizes take K, M and G (powers of 1024).`,
		Example: `  gtrain bench collectives
  gtrain bench collectives --collectives all_reduce,all_gather --min-bytes 4K --max-bytes 256M
  gtrain bench collectives --hostfile hosts.txt --dtype bfloat16 --output json
  gtrain run --nproc-per-node 4 -- gtrain bench collectives --collectives all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchRun(cmd.Context(), o, cmd.Flags().Changed("nproc-per-node"))
		},
	}
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	addLaunchFlags(f, &o.Launch)
	f.Lookup("nproc-per-node").DefValue = "2"
	o.Launch.NprocPerNode = 2
	f.StringSliceVar(&o.Collectives, "collectives", []string{"all_reduce"}, "collectives to time, or all: "+strings.Join(commbench.Collectives, ", "))
	f.StringVar(&o.DType, "dtype", "float32", "element type: float32, bfloat16 or float16")
	f.StringVar(&o.Op, "op", "sum", "reduce op: sum, avg, max or min")
	f.IntVar(&o.Root, "root", 0, "root rank of broadcast and reduce")
	f.StringVar(&o.MinBytes, "min-bytes", "8", "smallest message size")
	f.StringVar(&o.MaxBytes, "max-bytes", "64M", "largest message size")
	f.Int64Var(&o.StepFactor, "step-factor", 2, "multiply the size by this from one line to the next")
	f.IntVar(&o.Iters, "iters", 0, "timed iterations per size (0: from the size, 20 to 1000)")
	f.IntVar(&o.Warmup, "warmup", -1, "untimed iterations per size first (-1: a tenth of the iterations, at least 5)")
	f.BoolVar(&o.Check, "check", true, "check every result against a reference reduction (#wrong column)")
	f.StringVar(&o.Algorithm, "algorithm", "auto", "force an algorithm: auto, ring, rd (recursive doubling), tree, or direct (all ranks on one host)")
	f.DurationVar(&o.Timeout, "timeout", 60*time.Second, "fail, naming the peer, when one operation takes longer")
	addOutputFlag(f, &o.Output, "one document, from rank 0")
	return cmd
}

// benchRun is one rank of the benchmark when a launcher started this
// process (its job's store is in the environment), else the launcher of
// its ranks. nprocSet says whether --nproc-per-node was given.
func benchRun(ctx context.Context, o *BenchOptions, nprocSet bool) error {
	rc, err := commbench.ParseConfig(o.Flags)
	if err != nil {
		return err
	}
	if o.Launch.IO.Getenv(rankenv.StoreAddr) != "" {
		return benchRank(ctx, o, rc)
	}
	return benchLaunch(ctx, o, nprocSet)
}

// args are the bench flags as the ranks get them: every value explicit,
// so each rank measures exactly what the launcher was asked for.
func (o *BenchOptions) args() []string {
	return []string{
		"gtrain", "bench", "collectives",
		"--collectives=" + strings.Join(o.Collectives, ","),
		"--dtype=" + o.DType, "--op=" + o.Op, "--root=" + strconv.Itoa(o.Root),
		"--min-bytes=" + o.MinBytes, "--max-bytes=" + o.MaxBytes,
		"--step-factor=" + strconv.FormatInt(o.StepFactor, 10),
		"--iters=" + strconv.Itoa(o.Iters), "--warmup=" + strconv.Itoa(o.Warmup),
		"--check=" + strconv.FormatBool(o.Check), "--algorithm=" + o.Algorithm,
		"--timeout=" + o.Timeout.String(), "--output=" + o.Output,
	}
}

// benchLaunch starts the ranks, each running the benchmark, and shows rank
// 0's report as it is, the other ranks' output prefixed.
func benchLaunch(ctx context.Context, o *BenchOptions, nprocSet bool) error {
	nproc := o.Launch.NprocPerNode
	if o.Launch.Hostfile != "" && !nprocSet {
		nproc = 1 // the default 2 is for runs on this machine alone
	}
	if err := o.Launch.Check(nproc); err != nil {
		return err
	}
	job, err := o.Launch.Resolve(ctx, launch.Workload{Command: o.args(), NprocPerNode: nproc})
	if err != nil {
		return err
	}
	ios := o.Launch.IO
	lines := status.NewLines(ios.Out, ios.Err, len(job.Hosts) > 1)
	return execute(ctx, &o.Launch, job, &reportView{View: lines, out: ios.Out})
}

// reportView passes rank 0's stdout through unprefixed (the report), and
// everything else to the lines view.
type reportView struct {
	status.View
	out io.Writer
	err error
}

func (v *reportView) Event(ev proto.Event) {
	if ev.Type == proto.EventLog && ev.Rank == 0 && ev.Stream == "stdout" {
		if _, err := fmt.Fprintln(v.out, ev.Line); err != nil && v.err == nil {
			v.err = err
		}
		return
	}
	v.View.Event(ev)
}

func (v *reportView) Close() error {
	if err := v.View.Close(); err != nil {
		return err
	}
	return v.err
}

// benchRank is one rank: it measures with the others (commbench.RunRank)
// and, on rank 0, prints the report: the text table as results come, or
// the JSON document at the end.
func benchRank(ctx context.Context, o *BenchOptions, rc commbench.RankConfig) error {
	out := o.Launch.IO.Out
	var table io.Writer
	if o.Output == outputText {
		table = out
	}
	rep, err := commbench.RunRank(ctx, o.Launch.IO.Getenv, rc, table)
	if err != nil || rep == nil || o.Output != outputJSON {
		return err
	}
	return writeJSON(out, rep)
}
