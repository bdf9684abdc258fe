package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// LaunchOptions are the flags that say where and how a job's ranks run,
// shared by run, resume and bench collectives, with the command's streams
// and signals. They are set by flag parsing only: what a command decides
// besides (the ranks' command, a resume's world size) goes into ranks.
type LaunchOptions struct {
	IO      *IOStreams
	Signals *signals

	NprocPerNode int
	Hostfile     string
	Filter       hostfiles.Filter
	MasterAddr   string
	MasterPort   int
	RunID        string
	MaxRestarts  int
	Grace        time.Duration
	Heartbeat    time.Duration
	LogDir       string
	Env          []string
	EnvFile      string
	Chdir        string
	SSH          launch.SSHConfig
	RdzvBind     string
	RdzvHost     string
	JoinTimeout  time.Duration
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
}

// NewCmdRun wires the flags of `gtrain run` into RunOptions; runF (runRun
// when nil) does the work.
func NewCmdRun(ios *IOStreams, sig *signals, runF func(context.Context, *RunOptions) error) *cobra.Command {
	opts := &RunOptions{LaunchOptions: LaunchOptions{IO: ios, Signals: sig}}
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
  gtrain run --job examples/jobs/tiny.yaml --set optim.lr=1e-3
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
	f.BoolVar(&opts.DryRun, "dry-run", false, "resolve hosts, ranks and environments, print the plan, start nothing")
	f.BoolVar(&opts.Auto, "auto", false, "built-in engine: choose dp, ZeRO stage, micro-batch, grad accumulation and recompute with the planner (same global batch)")
	return cmd
}

// addRestartFlag adds --max-restarts, shared by run and resume.
func addRestartFlag(f *pflag.FlagSet, opts *LaunchOptions) {
	f.IntVar(&opts.MaxRestarts, "max-restarts", 0, "restart the whole job up to N times after a rank fails or a host is lost, waiting 1s, 2s, 4s, ... (at most 30s) before each; the built-in engine resumes from its newest checkpoint")
}

// addLaunchFlags adds the flags that say where and how ranks run: shared
// by run and by the commands that launch their own ranks (bench).
func addLaunchFlags(f *pflag.FlagSet, opts *LaunchOptions) {
	f.IntVar(&opts.NprocPerNode, "nproc-per-node", 1, "ranks to start on this machine (without --hostfile)")
	f.StringVarP(&opts.Hostfile, "hostfile", "H", "", "hostfile with \"host slots=N\" lines (DeepSpeed/Open MPI form)")
	f.StringVarP(&opts.Filter.Include, "include", "i", "", "use only these hosts/slots, e.g. worker-0:0,2@worker-1")
	f.StringVarP(&opts.Filter.Exclude, "exclude", "e", "", "leave out these hosts/slots, e.g. worker-1:0")
	f.IntVar(&opts.Filter.NumNodes, "num-nodes", 0, "use only the first N hosts of the hostfile")
	f.IntVar(&opts.Filter.NumSlots, "num-gpus", 0, "use only the first N slots of each host")
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
	f.StringVar(&opts.RdzvBind, "rdzv-bind", "", "address the rendezvous server listens on (default 127.0.0.1:0 on this machine alone, else :0)")
	f.StringVar(&opts.RdzvHost, "rdzv-host", "", "address remote agents dial for the rendezvous (default: this machine as each host's SSH session sees it)")
	f.DurationVar(&opts.JoinTimeout, "join-timeout", 60*time.Second, "how long every host's agent has to join before the job fails, naming the missing ones")
}

// runRun runs (or, with --dry-run, prints) the job: the command, or a
// fresh job of the built-in engine when there is none.
func runRun(ctx context.Context, o *RunOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	if len(o.Command) == 0 {
		return runEngine(ctx, o)
	}
	return o.launch(ctx, ranks{command: o.Command, nproc: o.NprocPerNode})
}

// runEngine runs a fresh job of the built-in engine, prepared by
// enginejob.Fresh, which holds its checkpoint directory until the job ends.
func runEngine(ctx context.Context, o *RunOptions) error {
	dir, err := o.workDir()
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
		Hostfile: o.Hostfile != "", DryRun: o.DryRun, Ranks: o.NprocPerNode, RunID: o.RunID, Args: os.Args,
		Warn: func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) },
	}
}

// launchEngine says what the built-in engine is about to train and runs
// its prepared job j.
func (o *RunOptions) launchEngine(ctx context.Context, j *enginejob.Job) error {
	c := j.Spec.Model.Config
	fmt.Fprintf(o.IO.Err, "gtrain: built-in engine: GPT-2 %d layers × %d hidden, %d steps; checkpoints in %s\n",
		c.Layers, c.Embd, j.Spec.Steps, j.Spec.Checkpoint.Dir)
	return o.launch(ctx, ranks{command: j.Command, env: j.Env, runID: j.RunID, nproc: j.Ranks})
}

// ranks is what a job's ranks run besides the launch flags: the command
// line's command, or what the built-in engine's preparation decided.
type ranks struct {
	command []string
	env     []string // KEY=VALUE for every rank, after --env-file and --env
	runID   string   // the job's id when already chosen (a lock names it); "" is --rdzv-id's
	nproc   int      // ranks on this machine, without a hostfile
}

// launch resolves the job whose ranks run r and runs it, or with --dry-run
// prints it.
func (o *RunOptions) launch(ctx context.Context, r ranks) error {
	job, err := o.job(ctx, r)
	if err != nil {
		return err
	}
	if o.DryRun {
		return printPlan(ctx, o.IO.Out, job, o.Output)
	}
	return execute(ctx, &o.LaunchOptions, job, o.view(job))
}

// job resolves hosts, environment and directory into the job whose ranks
// run r: its launch options are built here, once, from the flags and r.
func (o *LaunchOptions) job(ctx context.Context, r ranks) (*launch.Job, error) {
	nodes, fromFile, err := o.nodesFor(ctx, r.nproc)
	if err != nil {
		return nil, err
	}
	var fileEnv []string
	if o.EnvFile != "" {
		if fileEnv, err = launch.ReadEnvFile(ctx, o.EnvFile); err != nil {
			return nil, err
		}
	}
	env := slices.Concat(fileEnv, o.Env, r.env) // --env wins over the file
	if err := checkEnvSize(len(env), nodes); err != nil {
		return nil, err
	}
	dir, err := o.workDir()
	if err != nil {
		return nil, err
	}
	return launch.NewJob(launch.JobOptions{
		Nodes: nodes, FromHostfile: fromFile, Command: r.command,
		MasterAddr: o.MasterAddr, MasterPort: o.MasterPort, RunID: cmp.Or(r.runID, o.RunID),
		MaxRestarts: o.MaxRestarts, Grace: o.Grace, Heartbeat: o.Heartbeat,
		Dir: dir, Env: env, Forward: launch.ForwardEnv(os.Environ()), Getenv: o.IO.Getenv,
	})
}

// workDir is where the ranks run: --chdir, else this directory.
func (o *LaunchOptions) workDir() (string, error) {
	if o.Chdir != "" {
		return o.Chdir, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("run: %w", err)
	}
	return dir, nil
}

// minHeartbeat is the shortest --heartbeat: each beat is a message to every
// agent, and a host is declared lost after a few missed ones.
const minHeartbeat = 100 * time.Millisecond

// maxEnvEntries bounds the variables from --env and --env-file over all
// ranks together: every rank's plan holds its own copy of each, and
// --dry-run prints them all (about 200 bytes each).
const maxEnvEntries = 1 << 22

// checkEnvSize refuses more --env/--env-file variables than the job's ranks
// can each hold within maxEnvEntries.
func checkEnvSize(vars int, nodes []hostfiles.Node) error {
	ranks := 0
	for _, n := range nodes {
		ranks += len(n.SlotIDs)
	}
	if ranks > 0 && vars > maxEnvEntries/ranks {
		return usage.Errorf("run: %d variables from --env and --env-file for each of %d ranks: at most %d per rank at this size; set fewer, or put them in a file the ranks read",
			vars, ranks, maxEnvEntries/ranks)
	}
	return nil
}

// check validates flag values that need no I/O.
func (o *RunOptions) check() error {
	switch {
	case len(o.Command) > 0 && o.Auto:
		return usage.Errorf("run: --auto lays out the built-in engine, which runs when no command is given; drop it or the command %q", o.Command[0])
	case len(o.Command) > 0 && (o.Job != "" || len(o.Sets) > 0):
		return usage.Errorf("run: --job and --set configure the built-in engine, which runs when no command is given; drop them or the command %q", o.Command[0])
	}
	if err := o.LaunchOptions.check(o.NprocPerNode); err != nil {
		return err
	}
	if o.Table != "auto" && o.Table != "always" && o.Table != "never" {
		return usage.Errorf("run: --table %q: want auto, always or never", o.Table)
	}
	return nil
}

// check validates the launch flags for a job of nproc ranks on this
// machine (without a hostfile).
func (o *LaunchOptions) check(nproc int) error {
	switch {
	case nproc < 1 || nproc > hostfiles.MaxSlotsPerHost:
		return usage.Errorf("run: --nproc-per-node %d: want 1 to %d ranks on this machine", nproc, hostfiles.MaxSlotsPerHost)
	case o.MasterPort < 0 || o.MasterPort > 65535:
		return usage.Errorf("run: --master-port %d: must be 1-65535 (or 0 to pick a free port)", o.MasterPort)
	case o.MaxRestarts < 0:
		return usage.Errorf("run: --max-restarts %d: must be 0 or more", o.MaxRestarts)
	case o.Grace < 0:
		return usage.Errorf("run: --grace-period %v: must not be negative", o.Grace)
	case o.Heartbeat < minHeartbeat:
		return usage.Errorf("run: --heartbeat %v: must be at least %v", o.Heartbeat, minHeartbeat)
	case o.JoinTimeout < 0:
		return usage.Errorf("run: --join-timeout %v: must not be negative", o.JoinTimeout)
	}
	return nil
}

// nodes returns the hosts and slots to run on: from the hostfile and its
// filters, or this machine with --nproc-per-node slots.
func (o *LaunchOptions) nodes(ctx context.Context) ([]hostfiles.Node, bool, error) {
	return o.nodesFor(ctx, o.NprocPerNode)
}

// nodesFor returns the hosts and slots to run on: from the hostfile and its
// filters, or this machine with nproc slots.
func (o *LaunchOptions) nodesFor(ctx context.Context, nproc int) ([]hostfiles.Node, bool, error) {
	if o.Hostfile == "" {
		if o.Filter != (hostfiles.Filter{}) {
			return nil, false, &usage.Error{Err: errors.New("run: --include, --exclude, --num-nodes and --num-gpus select from a hostfile: give --hostfile")}
		}
		slots := make([]int, nproc)
		for i := range slots {
			slots[i] = i
		}
		return []hostfiles.Node{{Host: hostfiles.Host{Name: "localhost", Slots: nproc}, SlotIDs: slots}}, false, nil
	}
	if nproc != 1 {
		return nil, false, &usage.Error{Err: errors.New("run: --nproc-per-node is for runs without a hostfile; with --hostfile the slots come from the file (limit them with --num-gpus)")}
	}
	hosts, err := hostfiles.ReadFile(ctx, o.Hostfile)
	if err != nil {
		return nil, false, err
	}
	nodes, err := hostfiles.Select(hosts, o.Filter)
	if err != nil {
		return nil, false, &usage.Error{Err: err}
	}
	return nodes, true, nil
}

// execute runs the job as the launch flags o say, showing it in view.
func execute(ctx context.Context, o *LaunchOptions, plan *launch.Job, view status.View) error {
	local, err := launch.NewLocal()
	if err != nil {
		return err
	}
	// Hosts are dialled in parallel, before the event loop runs: serialise
	// their messages, since a view takes events from one goroutine at a time.
	var mu sync.Mutex
	remote := &launch.SSH{Config: o.SSH, Warn: func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		view.Event(proto.Event{V: proto.Version, Type: proto.EventNotice, Time: time.Now(), Rank: -1, Message: msg})
	}}
	tr := &launch.Mux{Local: local, Remote: remote}
	err = launch.Run(ctx, plan, launch.Runtime{Transport: tr, View: view, LogDir: o.LogDir, Abort: o.Signals.abort,
		JoinTimeout: o.JoinTimeout, RendezvousBind: o.RdzvBind, RendezvousHost: o.RdzvHost})
	code := ExitCode(err)
	msg := "all ranks exited 0"
	if err != nil {
		msg = err.Error()
	}
	view.Event(proto.Event{V: proto.Version, Type: proto.EventJobExited, Time: time.Now(), Rank: -1, Code: code, Message: msg})
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
func (o *RunOptions) view(plan *launch.Job) status.View {
	multiHost := len(plan.Hosts) > 1
	if o.Output == "json" {
		return status.NewJSON(o.IO.Out)
	}
	if o.Table == "always" || (o.Table == "auto" && o.IO.ErrTTY) {
		m := status.NewModel(rankInfos(plan))
		return status.NewTable(o.IO.Out, o.IO.Err, m, multiHost, 250*time.Millisecond)
	}
	return status.NewLines(o.IO.Out, o.IO.Err, multiHost)
}

func rankInfos(p *launch.Job) []status.RankInfo {
	out := make([]status.RankInfo, len(p.Ranks))
	for i, r := range p.Ranks {
		out[i] = status.RankInfo{Rank: r.Rank, LocalRank: r.LocalRank, Node: r.Node, Host: r.Host}
	}
	return out
}
