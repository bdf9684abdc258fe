package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// Request is a job as gtrain run's launch flags describe it (shared by
// resume and bench collectives): where its ranks run and how, before
// Resolve resolves it against the hostfile, the env file and the
// working directory. Only the flags set it; what a command decides besides
// (what the ranks run) is a Workload.
type Request struct {
	NprocPerNode int // ranks on this machine, without a hostfile
	// NprocFrom is --nproc-per-node gpu or auto: count the ranks on the
	// hardware (ResolveNproc; a hostfile's hosts without slots too).
	NprocFrom   string
	Hostfile    string           // "" = this machine alone
	Filter      hostfiles.Filter // which of the hostfile's hosts and slots
	MasterAddr  string
	MasterPort  int
	RunID       string // "" = a fresh random id
	MaxRestarts int
	Grace       time.Duration
	Heartbeat   time.Duration
	Env         []string // --env KEY=VALUE, in order
	EnvFile     string   // --env-file
	Chdir       string   // the ranks' working directory; "" = the launcher's
	Getenv      func(string) string
	Bind        BindMode // --bind: what each rank is bound to; "" = nothing

	// slotsCounted are the slots that the agents of the hostfile's remote
	// hosts written without slots= counted under NprocFrom (nproc.go),
	// so that a second read of the hostfile asks no host again.
	slotsCounted map[string]int

	// Hosts without a hostfile, and how their agents start (slurm.go).
	// Without either inside a Slurm allocation, and with Hostfile "slurm",
	// the job runs on the allocation's nodes.
	Hosts    string // --hosts: a Slurm hostlist, "node[01-04]"
	Launcher string // --launcher auto, ssh or srun; "" = auto

	// How Execute reaches the hosts and where it reports.
	SSH            SSHConfig
	LogDir         string
	JoinTimeout    time.Duration
	RendezvousBind string
	RendezvousHost string

	// --rdzv-backend (c10d or static: the launcher's own server, the
	// default; etcd), --rdzv-endpoint (etcd's HOST:PORT[,HOST:PORT...])
	// and --rdzv-conf (key=value,...: cacert, cert, key, user,
	// password_file, ttl); rdzv.go reads them.
	RendezvousBackend, RendezvousEndpoint, RendezvousConf string

	// HangTimeout and StragglerFactor are Runtime's (--hang-timeout,
	// --straggler-factor).
	HangTimeout     time.Duration
	StragglerFactor float64

	// NNodes is --nnodes, N or MIN:MAX ("" = every selected host, no
	// elasticity); MaxHostFailures is --max-host-failures (elastic.go).
	NNodes          string
	MaxHostFailures int
	// Plan is Runtime.Plan: the workload laid out for each attempt's world.
	Plan func(ctx context.Context, w World) (Planned, error)

	// Per-node mode (pernode.go): --node-rank (auto or K), --local-addr
	// (this node's name and address) and --rdzv-secret-file (the job
	// secret every node shares; else GTRAIN_RDZV_SECRET).
	NodeRank, LocalAddr, SecretFile string
}

// Workload is what a job's ranks run: the command line's command, or what
// the built-in engine's preparation decided.
type Workload struct {
	Command []string
	Env     []string // KEY=VALUE for every rank, on top of --env-file and --env
	RunID   string   // the job's id when already chosen (a lock names it); "" = the Request's
	// NprocPerNode overrides the Request's when positive (a resume keeps
	// the checkpoint's world size; bench collectives defaults to 2).
	NprocPerNode int
	// Digest, in per-node mode, names the job every node must run alike
	// (the built-in engine's spec): a round with nodes of other digests
	// fails, naming them. "" checks nothing (a command may differ by node).
	Digest string
}

// MinHeartbeat is the shortest heartbeat: each beat is a message to every
// agent, and a host is declared lost after a few missed ones.
const MinHeartbeat = 100 * time.Millisecond

// maxEnvEntries bounds the variables from --env and --env-file over all
// ranks together: every rank's Job holds its own copy of each, and
// --dry-run prints them all (about 200 bytes each).
const maxEnvEntries = 1 << 22

// Check validates the request's values for a job of nproc ranks on this
// machine (without a hostfile); it does no I/O.
func (r *Request) Check(nproc int) error {
	switch {
	case nproc < 1 || nproc > hostfiles.MaxSlotsPerHost:
		return usage.Errorf("run: --nproc-per-node %d: want 1 to %d ranks on this machine", nproc, hostfiles.MaxSlotsPerHost)
	case r.MasterPort < 0 || r.MasterPort > 65535:
		return usage.Errorf("run: --master-port %d: must be 1-65535 (or 0 to pick a free port)", r.MasterPort)
	case r.MaxRestarts < 0:
		return usage.Errorf("run: --max-restarts %d: must be 0 or more", r.MaxRestarts)
	case r.Grace < 0:
		return usage.Errorf("run: --grace-period %v: must not be negative", r.Grace)
	case r.Heartbeat < MinHeartbeat:
		return usage.Errorf("run: --heartbeat %v: must be at least %v", r.Heartbeat, MinHeartbeat)
	case r.JoinTimeout < 0:
		return usage.Errorf("run: --join-timeout %v: must not be negative", r.JoinTimeout)
	}
	if _, err := r.etcdConfig(); err != nil {
		return err
	}
	if r.PerNode() {
		if _, _, _, err := r.CheckPerNode(); err != nil {
			return err
		}
	}
	return r.checkWatch()
}

// Nodes returns the hosts and slots to run on: from the hostfile and its
// filters, or this machine with nproc slots; fromFile says which.
func (r *Request) Nodes(ctx context.Context, nproc int) (nodes []hostfiles.Node, fromFile bool, err error) {
	if nodes, ok, err := r.clusterNodes(nproc); ok {
		return nodes, err == nil, err
	}
	if r.Hostfile == "" {
		if r.Filter != (hostfiles.Filter{}) {
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
	hosts, err := r.readHostfile(ctx)
	if err != nil {
		return nil, false, err
	}
	nodes, err = hostfiles.Select(hosts, r.Filter)
	if err != nil {
		return nil, false, &usage.Error{Err: err}
	}
	return nodes, true, nil
}

// WorkDir is where the ranks run: Chdir, else the launcher's directory.
func (r *Request) WorkDir() (string, error) {
	if r.Chdir != "" {
		return r.Chdir, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("run: %w", err)
	}
	return dir, nil
}

// Resolve resolves the request for workload w into the Job that Run executes
// and --dry-run prints: hosts and slots, the env file and --env (--env
// wins, w.Env last), the working directory, and the launcher's variables
// that every rank gets (ForwardEnv).
func (r *Request) Resolve(ctx context.Context, w Workload) (*Job, error) {
	if err := r.ResolveNproc(ctx); err != nil {
		return nil, err
	}
	nodes, fromFile, err := r.Nodes(ctx, cmp.Or(w.NprocPerNode, r.NprocPerNode))
	if err != nil {
		return nil, err
	}
	nodes, elastic, err := r.elastic(nodes)
	if err != nil {
		return nil, err
	}
	var fileEnv []string
	if r.EnvFile != "" {
		if fileEnv, err = ReadEnvFile(ctx, r.EnvFile); err != nil {
			return nil, err
		}
	}
	env := slices.Concat(fileEnv, r.Env, w.Env)
	if err := checkEnvSize(len(env), nodes); err != nil {
		return nil, err
	}
	dir, err := r.WorkDir()
	if err != nil {
		return nil, err
	}
	p, err := NewJob(JobOptions{
		Nodes: nodes, FromHostfile: fromFile, Command: w.Command,
		MasterAddr: r.MasterAddr, MasterPort: r.MasterPort, RunID: cmp.Or(w.RunID, r.RunID),
		MaxRestarts: r.MaxRestarts, Grace: r.Grace, Heartbeat: r.Heartbeat,
		Dir: dir, Env: env, Forward: ForwardEnv(os.Environ()), Getenv: r.Getenv,
		Bind: r.Bind, LocalHost: func() *hostinfo.Host { return DetectHost(ctx) },
	})
	if p != nil {
		p.Elastic = elastic
	}
	return p, err
}

// elastic applies --nnodes to the selected nodes: the ones the job starts
// on, and its elastic membership (nil without --nnodes).
func (r *Request) elastic(nodes []hostfiles.Node) ([]hostfiles.Node, *Elastic, error) {
	if r.NNodes == "" {
		return nodes, nil, nil
	}
	lo, hi, err := ParseNNodes(r.NNodes)
	if err != nil {
		return nil, nil, err
	}
	return elasticNodes(nodes, lo, hi, r.MaxHostFailures)
}

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

// Execute runs job with the transports gtrain uses — this machine's agent
// as a child, every other host's over SSH — showing it in view: Run with a
// Mux of Local and SSH. SSH's warnings (an unreadable identity) reach view
// as notices. abort is Runtime.Abort. The view is not closed.
func (r *Request) Execute(ctx context.Context, job *Job, view status.View, abort <-chan struct{}) error {
	local, err := NewLocal()
	if err != nil {
		return err
	}
	// Hosts are dialled in parallel, before the event loop runs: serialise
	// their messages, since a view takes events from one goroutine at a time.
	var mu sync.Mutex
	remote := &SSH{Config: r.SSH, Warn: func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		view.Event(proto.Event{V: proto.Version, Type: proto.EventNotice, Time: time.Now(), Rank: -1, Message: msg})
	}}
	tr, err := r.transport(local, remote)
	if err != nil {
		return err
	}
	etcd, err := r.etcdConfig()
	if err != nil {
		return err
	}
	return Run(ctx, job, Runtime{Transport: tr, View: view, LogDir: r.LogDir, Abort: abort,
		JoinTimeout: r.JoinTimeout, RendezvousBind: r.RendezvousBind, RendezvousHost: r.RendezvousHost,
		HangTimeout: r.HangTimeout, StragglerFactor: r.StragglerFactor, Plan: r.Plan, RestartJitter: restartJitter,
		Etcd: etcd})
}

// RankInfos are the job's ranks as the status model lists them.
func (p *Job) RankInfos() []status.RankInfo {
	out := make([]status.RankInfo, len(p.Ranks))
	for i, r := range p.Ranks {
		out[i] = status.RankInfo{Rank: r.Rank, LocalRank: r.LocalRank, Node: r.Node, Host: r.Host}
	}
	return out
}
