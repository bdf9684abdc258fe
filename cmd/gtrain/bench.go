package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/commbench"
	"github.com/gtrain/gtrain/engine/dist"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// NewCmdBench is `gtrain bench`, the parent of the benchmarks.
func NewCmdBench(ios *IOStreams, sig *signals) *cobra.Command {
	return newGroup("bench", "Measure gtrain's building blocks on a cluster", "", NewCmdBenchCollectives(ios, sig))
}

// BenchOptions are the inputs of `gtrain bench collectives`.
type BenchOptions struct {
	Run         RunOptions // where the ranks run
	Collectives []string
	DType       string
	Op          string
	Root        int
	MinBytes    string
	MaxBytes    string
	StepFactor  int64
	Iters       int
	Warmup      int
	Check       bool
	Algorithm   string
	Timeout     time.Duration
	Output      string // text or json
}

// NewCmdBenchCollectives is `gtrain bench collectives`.
func NewCmdBenchCollectives(ios *IOStreams, sig *signals) *cobra.Command {
	o := &BenchOptions{Run: RunOptions{IO: ios, Signals: sig}}
	cmd := &cobra.Command{
		Use:   "collectives [flags]",
		Short: "Time the built-in collectives across the ranks of a job, nccl-tests style",
		Long: `Time the built-in collective library (engine/comm) across the ranks of a job:
for each collective and message size, the median, minimum and maximum time
over the iterations after a warm-up (each iteration as long as its slowest
rank), the algorithm bandwidth (size/time) and bus bandwidth (nccl-tests'
definitions), and the number of wrong elements in a checked run.

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
			cfg, err := o.config()
			if err != nil {
				return err
			}
			if ios.Getenv(dist.EnvStoreAddr) != "" {
				return benchWorker(cmd.Context(), o, cfg)
			}
			if o.Run.Hostfile != "" && !cmd.Flags().Changed("nproc-per-node") {
				o.Run.NprocPerNode = 1 // the default 2 is for runs on this machine alone
			}
			return benchLaunch(cmd.Context(), o)
		},
	}
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	addLaunchFlags(f, &o.Run)
	f.Lookup("nproc-per-node").DefValue = "2"
	o.Run.NprocPerNode = 2
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

// config checks the bench flags and turns them into a commbench.Config.
func (o *BenchOptions) config() (commbench.Config, error) {
	usage := func(err error) error { return usage.Errorf("bench collectives: %w", err) }
	cfg := commbench.Config{Root: o.Root, StepFactor: o.StepFactor, Iters: o.Iters, Warmup: o.Warmup, Check: o.Check}
	for _, c := range o.Collectives {
		if c == "all" {
			cfg.Collectives = append(cfg.Collectives, commbench.Collectives...)
		} else if !slices.Contains(commbench.Collectives, c) {
			return cfg, usage(fmt.Errorf("--collectives: unknown collective %q (want all, or some of %s)", c, strings.Join(commbench.Collectives, ", ")))
		} else {
			cfg.Collectives = append(cfg.Collectives, c)
		}
	}
	var err error
	if cfg.DType, err = comm.ParseDType(o.DType); err != nil {
		return cfg, usage(fmt.Errorf("--dtype: %w", err))
	}
	if cfg.Op, err = comm.ParseOp(o.Op); err != nil {
		return cfg, usage(fmt.Errorf("--op: %w", err))
	}
	if cfg.MinBytes, err = parseBytes(o.MinBytes); err != nil {
		return cfg, usage(fmt.Errorf("--min-bytes: %w", err))
	}
	if cfg.MaxBytes, err = parseBytes(o.MaxBytes); err != nil {
		return cfg, usage(fmt.Errorf("--max-bytes: %w", err))
	}
	switch {
	case cfg.MinBytes < 1 || cfg.MaxBytes < cfg.MinBytes:
		return cfg, usage(fmt.Errorf("--min-bytes %s and --max-bytes %s: want 1 <= min <= max", o.MinBytes, o.MaxBytes))
	case cfg.MaxBytes > 16<<30:
		return cfg, usage(fmt.Errorf("--max-bytes %s: at most 16G", o.MaxBytes))
	case o.StepFactor < 2:
		return cfg, usage(fmt.Errorf("--step-factor %d: want 2 or more", o.StepFactor))
	case o.Iters < 0:
		return cfg, usage(fmt.Errorf("--iters %d: want 0 (auto) or more", o.Iters))
	case o.Warmup < -1:
		return cfg, usage(fmt.Errorf("--warmup %d: want -1 (auto) or more", o.Warmup))
	case o.Root < 0:
		return cfg, usage(fmt.Errorf("--root %d: must not be negative", o.Root))
	case o.Timeout <= 0:
		return cfg, usage(fmt.Errorf("--timeout %v: must be positive", o.Timeout))
	}
	if !slices.Contains([]string{"auto", "ring", "rd", "tree", "direct"}, o.Algorithm) {
		return cfg, usage(fmt.Errorf("--algorithm %q: want auto, ring, rd, tree or direct", o.Algorithm))
	}
	return cfg, nil
}

// parseBytes reads a size: a number with an optional K, M or G (powers of
// 1024, with or without "iB" or "B").
func parseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 4096, 64K, 256M, 1G)", s)
	}
	return v * mult, nil
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
func benchLaunch(ctx context.Context, o *BenchOptions) error {
	o.Run.Command = o.args()
	o.Run.Output, o.Run.Table = "text", "never"
	if err := o.Run.check(); err != nil {
		return err
	}
	plan, err := o.Run.plan(ctx)
	if err != nil {
		return err
	}
	lines := status.NewLines(o.Run.IO.Out, o.Run.IO.Err, len(plan.Hosts) > 1)
	return execute(ctx, &o.Run, plan, &reportView{View: lines, out: o.Run.IO.Out})
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

// benchWorker is one rank: connect to the others through the job's store,
// measure, and (rank 0) print.
func benchWorker(ctx context.Context, o *BenchOptions, cfg commbench.Config) error {
	env, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	w, err := dist.Init(ctx, env, dist.Options{Comm: comm.Options{Algorithm: o.Algorithm, Timeout: o.Timeout}})
	if err != nil {
		return err
	}
	defer w.Close()
	rep := commbench.Report{WorldSize: env.WorldSize, Hosts: w.Hosts(), Algorithm: o.Algorithm}
	out := o.Run.IO.Out
	tab := commbench.NewTable(out)
	text := o.Output == "text" && env.Rank == 0
	if text {
		tab.Preamble(rep, cfg)
	}
	err = commbench.Run(ctx, w.Comm, cfg, func(r commbench.Result) {
		rep.Results = append(rep.Results, r)
		if text {
			tab.Row(r)
		}
	})
	if err != nil {
		return err
	}
	if env.Rank != 0 {
		return nil
	}
	if o.Output == "json" {
		return writeJSON(out, rep)
	}
	return tab.Err()
}
