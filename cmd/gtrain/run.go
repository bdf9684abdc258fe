package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
	"github.com/gtrain/gtrain/planner"
)

// LaunchOptions are the flags that say where and how a job's ranks run,
// shared by run, resume and bench collectives (a launch.Request, bound by
// addLaunchFlags), with the command's streams and signals. Only flag
// parsing sets them: what a command decides besides goes into a
// launch.Workload.
type LaunchOptions struct {
	IO      *IOStreams
	Signals *signals
	launch.Request
}

// newLaunchOptions are the launch options of a command reading the
// environment through ios.
func newLaunchOptions(ios *IOStreams, sig *signals) LaunchOptions {
	return LaunchOptions{IO: ios, Signals: sig, Request: launch.Request{Getenv: ios.Getenv}}
}

// RunOptions are the inputs of `gtrain run`, and of `gtrain resume`, which
// takes its flags but no command.
type RunOptions struct {
	LaunchOptions

	Command []string
	Job     string   // job file of the built-in engine (no command)
	Sets    []string // key=value overrides of the job
	Output  string   // text or json
	Table   string   // auto, always, never
	DryRun  bool
	Auto    bool // built-in engine: pick the layout with the planner (auto.go)
	// MetricsAddr is --metrics-addr, where to serve Prometheus metrics
	// (metrics.go).
	MetricsAddr string
}

// engineLaunch is what launchEngine decides besides the workload, kept out
// of the options (which stay as parsed): the rank grid --dry-run prints
// (nil without tensor or pipeline parallelism), the spec the metrics' job
// info names when nothing plans the attempts, and the planning hook of
// each attempt (launch.Runtime.Plan), which names it in layout.
type engineLaunch struct {
	grid   *planner.Grid
	spec   *train.Spec
	layout *attemptLayout
	plan   func(context.Context, launch.World) (launch.Planned, error)
}

// NewCmdRun wires the flags of `gtrain run` into RunOptions; runF (runRun
// when nil) does the work.
func NewCmdRun(ios *IOStreams, sig *signals, runF func(context.Context, *RunOptions) error) *cobra.Command {
	opts := &RunOptions{LaunchOptions: newLaunchOptions(ios, sig)}
	if runF == nil {
		runF = runRun
	}
	cmd := &cobra.Command{
		Use:   "run [flags] [--] [command [args...]]",
		Short: "Launch a job: one rank per slot on every host",
		Long: `Launch a job: one rank of the command per slot on every host of the hostfile,
or --nproc-per-node ranks on this machine when no hostfile is given. Each rank
gets the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...).
The first rank to fail stops the whole job; gtrain exits with its code.

Without a command, every rank runs gtrain's built-in engine on the job file
given with --job (YAML: model, data, optimizer, steps, checkpoints), or on the
built-in default job: a tiny GPT trained on a synthetic corpus.

Flags come before the command; everything from the command on is passed to it.`,
		Example: `  gtrain run
  gtrain run --job examples/jobs/default.yaml --set optim.lr=1e-3
  gtrain run --nproc-per-node 4 -- python3 train.py --lr 3e-4
  gtrain run --hostfile hosts.txt --exclude worker-1:0 -- python3 train.py
  gtrain run --dry-run --output json --nproc-per-node 2 -- ./a.out`,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Command = args
			return runF(cmd.Context(), opts)
		},
	}
	// Flags end at the command: `gtrain run python3 x.py --lr 1` passes --lr on.
	cmd.Flags().SetInterspersed(false)
	// torchrun spells its flags with underscores; accept both spellings.
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	addLaunchFlags(f, &opts.LaunchOptions)
	f.StringVar(&opts.Job, "job", "", "YAML job file for the built-in engine (no command; default: the built-in default job)")
	f.StringArrayVar(&opts.Sets, "set", nil, "override a key of the job, e.g. --set optim.lr=3e-4 (repeatable)")
	addRestartFlag(f, &opts.LaunchOptions)
	addOutputFlag(f, &opts.Output, "events (or the --dry-run job) as JSON lines on stdout")
	f.StringVar(&opts.Table, "table", "auto", "live status table on stderr: auto (when a terminal), always, never")
	f.BoolVar(&opts.DryRun, "dry-run", false, "resolve hosts, ranks and environments, print the job, start nothing")
	addMetricsFlag(f, opts)
	f.BoolVar(&opts.Auto, "auto", false, "built-in engine: choose tp, pp (and virtual stages), dp, ZeRO stage, micro-batch, grad accumulation and recompute with the planner (same global batch)")
	return cmd
}

// addRestartFlag adds --max-restarts, shared by run and resume.
func addRestartFlag(f *pflag.FlagSet, opts *LaunchOptions) {
	f.IntVar(&opts.MaxRestarts, "max-restarts", 0, "restart the whole job up to N times after a rank fails or a host is lost, waiting 1s, 2s, 4s, ... (at most 30s, plus up to 10% at random) before each; the built-in engine resumes from its newest checkpoint")
	f.StringVar(&opts.NNodes, "nnodes", "", "elastic: run on MIN:MAX (or N) of the hostfile's hosts, the rest spares; a restart drops lost hosts, brings spares in and goes on while MIN remain (the built-in engine reshards, keeping its global batch); default: every host, no elasticity")
	f.IntVar(&opts.MaxHostFailures, "max-host-failures", launch.DefaultMaxHostFailures, "with --nnodes: exclude a host for the rest of the job after this many failures blamed on it")
}

// addLaunchFlags adds the flags that say where and how ranks run: shared
// by run and by the commands that launch their own ranks (bench).
func addLaunchFlags(f *pflag.FlagSet, opts *LaunchOptions) {
	opts.NprocPerNode = 1
	f.Var((*nprocFlag)(&opts.Request), "nproc-per-node", "ranks to start on this machine (without --hostfile): a number, gpu (one per GPU) or auto (one per GPU, else per CPU); gpu and auto also count a hostfile's local host written without slots")
	opts.Bind = launch.BindAuto
	f.Var((*bindFlag)(&opts.Bind), "bind", "bind each rank: auto (as mpirun: core for at most 2 ranks per host, else numa), core (its own share of the cores of its GPU's NUMA node), numa (that node's cores, shared), gpu (numa, and CUDA_VISIBLE_DEVICES = its GPU only: for code using cuda:0), none; all but none set OMP_NUM_THREADS and the nearest NIC unless you did")
	addHostfileFlags(f, &opts.Hostfile, &opts.Filter, "use")
	f.StringVar(&opts.Hosts, "hosts", "", "hosts as a Slurm hostlist, 'node[01-04],gpu-7', each with --nproc-per-node ranks (instead of --hostfile; --hostfile slurm, or neither inside an allocation, runs on the Slurm allocation's nodes)")
	f.StringVar(&opts.Launcher, "launcher", launch.LauncherAuto, "how agents start on the hosts: auto (srun on a Slurm allocation's nodes, else ssh), ssh, srun")
	f.StringVar(&opts.MasterAddr, "master-addr", "", "MASTER_ADDR (default: node 0's address as the launcher reached it; 127.0.0.1 on this machine alone)")
	f.IntVar(&opts.MasterPort, "master-port", 0, "MASTER_PORT (default: a free port picked for this job)")
	f.StringVar(&opts.RunID, "rdzv-id", "", "job id given to ranks as TORCHELASTIC_RUN_ID (default: random)")
	f.DurationVar(&opts.Grace, "grace-period", 30*time.Second, "time between SIGTERM and SIGKILL at teardown")
	f.DurationVar(&opts.Heartbeat, "heartbeat", 5*time.Second, "heartbeat between launcher and agents; 5 missed (at least 3s) = host lost")
	f.StringVar(&opts.LogDir, "log-dir", "", "write each rank's output to DIR/<rdzv-id>/attempt-N/rank-R.log")
	f.StringArrayVar(&opts.Env, "env", nil, "set KEY=VALUE in every rank's environment (repeatable)")
	f.StringVar(&opts.EnvFile, "env-file", "", "read KEY=VALUE lines for every rank's environment from a file")
	f.StringVar(&opts.Chdir, "chdir", "", "working directory of the ranks on every host (default: this directory)")
	addSSHFlags(f, &opts.SSH)
	f.StringVar(&opts.RendezvousBind, "rdzv-bind", "", "address the rendezvous server listens on (default 127.0.0.1:0 on this machine alone, else :0)")
	f.StringVar(&opts.RendezvousHost, "rdzv-host", "", "address remote agents dial for the rendezvous (default: this machine as each host's SSH session sees it)")
	f.StringVar(&opts.RendezvousBackend, "rdzv-backend", "c10d", "where nodes and ranks meet: c10d (or static: the launcher's own server) or etcd (--rdzv-endpoint; it outlives the launcher)")
	f.StringVar(&opts.RendezvousEndpoint, "rdzv-endpoint", "", "etcd's client address HOST:PORT[,HOST:PORT...] for --rdzv-backend etcd; the job meets under /gtrain/<rdzv-id>/; in per-node mode with c10d, HOST:PORT of the node that hosts the rendezvous")
	f.StringVar(&opts.NodeRank, "node-rank", "", "per-node mode: start this node of a job started once on every node (torchrun's model: no hostfile, no SSH; needs --nnodes, --rdzv-endpoint, --rdzv-id and the job secret): auto (ranks by node name) or 0 to N-1; without a command every node runs the built-in engine on the same job (checked), rank 0 on node 0 writing runs/<rdzv-id> (shared by all nodes) unless checkpoint.dir is set; started again with the same --rdzv-id (a pod its scheduler restarted) the job resumes from its newest checkpoint there, with no other flag, so that a manifest written once recovers; another job with that id is refused")
	f.StringVar(&opts.LocalAddr, "local-addr", "", "per-node mode: this node's name and the address the others reach it at (default: its hostname, and its address on the route to the rendezvous)")
	f.StringVar(&opts.SecretFile, "rdzv-secret-file", "", "per-node mode: file holding the job secret (at least 16 bytes), the same on every node; else $"+launch.SecretEnv)
	f.StringVar(&opts.RendezvousConf, "rdzv-conf", "", "etcd options key=value,...: cacert, cert, key (TLS files, the same path on every host), user and password_file (etcd's user auth), ttl (a node's lease, default 10s)")
	f.DurationVar(&opts.JoinTimeout, "join-timeout", 60*time.Second, "how long every host's agent has to join before the job fails, naming the missing ones")
	f.DurationVar(&opts.HangTimeout, "hang-timeout", launch.DefaultHangTimeout, "a rank that reported a step and then none for this long (its process alive) makes every built-in engine rank dump its flight record and stacks into --log-dir; the job stops naming whom the ranks wait for, in which call (0: off)")
	f.Float64Var(&opts.StragglerFactor, "straggler-factor", launch.DefaultStragglerFactor, "mark a rank whose own work per step (step time less time waiting for others) stays above this many times the job's median, and 20 ms more, over 8 steps (0: off)")
}

// runRun runs (or, with --dry-run, prints) the job: the command, or a
// fresh job of the built-in engine when there is none.
func runRun(ctx context.Context, o *RunOptions) error {
	if err := o.ResolveNproc(ctx); err != nil {
		return err
	}
	if err := o.check(); err != nil {
		return err
	}
	if o.PerNode() {
		return o.runPerNode(ctx)
	}
	if len(o.Command) == 0 {
		return runEngine(ctx, o)
	}
	return o.launch(ctx, launch.Workload{Command: o.Command}, engineLaunch{})
}

// runEngine runs a fresh job of the built-in engine, prepared by
// enginejob.Fresh, which holds its checkpoint directory until the job ends.
func runEngine(ctx context.Context, o *RunOptions) error {
	dir, err := o.WorkDir()
	if err != nil {
		return err
	}
	eo := o.engineOptions()
	eo.Job, eo.Sets, eo.Layout, eo.Dir = o.Job, o.Sets, o.autoLayout, dir
	j, err := enginejob.Fresh(ctx, eo)
	if err != nil {
		return err
	}
	defer j.Release()
	return o.launchEngine(ctx, j)
}

// engineOptions are the options of a job of the built-in engine that the
// launch flags set.
func (o *RunOptions) engineOptions() enginejob.Options {
	return enginejob.Options{
		Hostfile: o.MultiHost(), DryRun: o.DryRun, Ranks: o.NprocPerNode, RunID: o.RunID, Args: os.Args,
		Warn: func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) },
	}
}

// launchEngine says what the built-in engine is about to train and runs
// its prepared job j.
func (o *RunOptions) launchEngine(ctx context.Context, j *enginejob.Job) error {
	o.sayEngine(j)
	e := engineLaunch{spec: &j.Spec, layout: &attemptLayout{}}
	if p := j.Spec.Parallel; p.ModelParallel() > 1 {
		e.grid = &planner.Grid{TP: p.TP, PP: p.PP, DP: p.DP}
	}
	if o.NNodes != "" || o.autoFromFacts() {
		line := func(c train.AutoChoice) string { return strings.TrimPrefix(autoLine(c), "gtrain: ") }
		e.plan = j.Planner(enginejob.PlanOptions{Auto: o.Auto, Line: line, Layout: e.layout.planned})
	}
	return o.launch(ctx, launch.Workload{Command: j.Command, Env: j.Env, RunID: j.RunID, NprocPerNode: j.Ranks}, e)
}

// sayEngine says what the built-in engine is about to train.
func (o *RunOptions) sayEngine(j *enginejob.Job) {
	c := j.Spec.Model.Config
	sched := ""
	if s := j.Spec.Parallel.Schedule(); s != "" {
		sched = ", pipeline schedule " + s
	}
	fmt.Fprintf(o.IO.Err, "gtrain: built-in engine: GPT-2 %d layers × %d hidden, %d steps%s; checkpoints in %s\n",
		c.Layers, c.Embd, j.Spec.Steps, sched, j.Spec.Checkpoint.Dir)
}

// launch resolves the job whose ranks run w and runs it, or with --dry-run
// prints it, and (as text) the rank grid of the built-in engine's tensor-
// and pipeline-parallel layout when e has one.
func (o *RunOptions) launch(ctx context.Context, w launch.Workload, e engineLaunch) error {
	lo := o.LaunchOptions // a copy: the planning hook is this job's, not a flag's
	lo.Plan = e.plan
	job, err := lo.Resolve(ctx, w)
	if err != nil {
		return err
	}
	if o.DryRun {
		if err := printJob(ctx, o.IO.Out, job, o.Output); err != nil || e.grid == nil || o.Output != outputText {
			return err
		}
		return printJobGrid(ctx, o.IO.Out, job, *e.grid)
	}
	return o.executeWithMetrics(ctx, &lo, job, e)
}

// runPerNode runs this node of a per-node job (launch.Request.RunPerNode):
// the command, or the built-in engine when there is none
// (pernode_engine.go). The job's shape is known only once the nodes meet:
// no dry run, and the status is lines or JSON events.
func (o *RunOptions) runPerNode(ctx context.Context) error {
	switch {
	case o.DryRun && len(o.Command) == 0:
		return usage.Errorf("run: --dry-run: a per-node job's nodes and ranks are known only when its nodes meet; to see the built-in engine's job, run the same command without --nnodes, --node-rank and --rdzv-endpoint")
	case o.DryRun:
		return usage.Errorf("run: --dry-run: a per-node job's nodes and ranks are known only when its nodes meet")
	case len(o.Command) == 0:
		return o.runPerNodeEngine(ctx)
	}
	return o.perNodeRun(ctx, &o.LaunchOptions, launch.Workload{Command: o.Command}, nil)
}

// check validates flag values that need no I/O.
func (o *RunOptions) check() error {
	switch {
	case len(o.Command) > 0 && o.Auto:
		return usage.Errorf("run: --auto lays out the built-in engine, which runs when no command is given; drop it or the command %q", o.Command[0])
	case len(o.Command) > 0 && (o.Job != "" || len(o.Sets) > 0):
		return usage.Errorf("run: --job and --set configure the built-in engine, which runs when no command is given; drop them or the command %q", o.Command[0])
	}
	if err := o.Request.Check(o.NprocPerNode); err != nil {
		return err
	}
	if err := o.checkMetricsAddr(); err != nil {
		return err
	}
	if o.Table != "auto" && o.Table != "always" && o.Table != "never" {
		return usage.Errorf("run: --table %q: want auto, always or never", o.Table)
	}
	return nil
}

// execute runs job (launch.Request.Execute), showing it in view, and
// ends the view with the job's exit code.
func execute(ctx context.Context, o *LaunchOptions, job *launch.Job, view status.View) error {
	return endView(view, o.Execute(ctx, job, view, o.Signals.abort))
}

// endView ends view with the job's exit code and returns err, which the
// view has shown.
func endView(view status.View, err error) error {
	msg := "all ranks exited 0"
	if err != nil {
		msg = err.Error()
	}
	view.Event(proto.Event{V: proto.Version, Type: proto.EventJobExited, Time: time.Now(), Rank: -1, Code: ExitCode(err), Message: msg})
	if cerr := view.Close(); err == nil && cerr != nil {
		return cerr
	}
	if err != nil {
		// The views have told the story (the failure report is a notice);
		// keep the exit code without printing the error a second time.
		return &silentError{err}
	}
	return nil
}

// view builds the output of a run: JSON events, a live table, or prefixed lines.
func (o *RunOptions) view(job *launch.Job) status.View {
	multiHost := len(job.Hosts) > 1
	if o.Output == "json" {
		return status.NewJSON(o.IO.Out)
	}
	if o.Table == "always" || (o.Table == "auto" && o.IO.ErrTTY) {
		m := status.NewModel(job.RankInfos())
		return status.NewTable(o.IO.Out, o.IO.Err, m, multiHost, 250*time.Millisecond)
	}
	return status.NewLines(o.IO.Out, o.IO.Err, multiHost)
}

// bindFlag is --bind, checked as it is parsed.
type bindFlag launch.BindMode

func (b *bindFlag) String() string { return string(*b) }
func (b *bindFlag) Type() string   { return "mode" }

// Set reads one of none, gpu, numa, core, auto.
func (b *bindFlag) Set(s string) error {
	m, err := launch.ParseBindMode(s)
	if err != nil {
		return err
	}
	*b = bindFlag(m)
	return nil
}

// nprocFlag is --nproc-per-node: a number, or gpu or auto, counted on the
// hardware when the job is resolved (launch.Request.ResolveNproc).
type nprocFlag launch.Request

func (n *nprocFlag) String() string {
	if n.NprocFrom != "" {
		return n.NprocFrom
	}
	return strconv.Itoa(n.NprocPerNode)
}

func (n *nprocFlag) Type() string { return "int|gpu|auto" }

// Set reads a number of ranks, gpu or auto.
func (n *nprocFlag) Set(s string) error {
	if s == launch.NprocGPU || s == launch.NprocAuto {
		n.NprocFrom, n.NprocPerNode = s, 1 // the count comes later
		return nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a number of ranks, gpu or auto")
	}
	n.NprocFrom, n.NprocPerNode = "", v
	return nil
}
