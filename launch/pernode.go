package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/status"
	"github.com/gtrain/gtrain/rendezvous"
)

// Per-node mode (torchrun's model, for Kubernetes and any scheduler):
// `gtrain run --nnodes N[:M] --rdzv-endpoint H:P --rdzv-id JOB` is started
// once on every node. No hostfile, no SSH: each invocation runs its own
// node's agent (Local) and meets the others in the job's store: etcd
// (--rdzv-backend etcd), or, with c10d, a rendezvous server hosted by the
// node whose address the endpoint names (as torchrun's c10d is_host).
// Each attempt: a membership round (pernode_meet.go) fixes the nodes and
// their ranks, every node builds the same Job from it, and runs the
// attempt as the SSH launcher does, with the other nodes as peerConns
// watched through the store (pernode_watch.go).

// SecretEnv names the variable that can hold the job secret of per-node
// mode instead of --rdzv-secret-file.
const SecretEnv = "GTRAIN_RDZV_SECRET"

// maxSecretFile bounds --rdzv-secret-file.
const maxSecretFile = 4 << 10

// PerNode reports whether the request starts one node of a per-node job:
// --node-rank given, or --nnodes and --rdzv-endpoint without hosts.
func (r *Request) PerNode() bool {
	return r.NodeRank != "" || (r.Hostfile == "" && r.Hosts == "" && r.NNodes != "" && r.RendezvousEndpoint != "")
}

// CheckPerNode validates per-node mode's flags and returns --nnodes's
// bounds and the node rank (-1: auto); it does no I/O.
func (r *Request) CheckPerNode() (lo, hi, rank int, err error) {
	switch {
	case r.Hostfile != "" || r.Hosts != "":
		return 0, 0, 0, usage.Errorf("run: --node-rank starts one node of a job started on every node: it takes no --hostfile or --hosts")
	case r.NNodes == "":
		return 0, 0, 0, usage.Errorf("run: per-node mode (--node-rank) needs --nnodes N or MIN:MAX, the job's nodes")
	case r.RendezvousEndpoint == "":
		return 0, 0, 0, usage.Errorf("run: per-node mode needs --rdzv-endpoint HOST:PORT, where the nodes meet (etcd, or the node hosting the c10d rendezvous)")
	case r.RunID == "":
		return 0, 0, 0, usage.Errorf("run: per-node mode needs --rdzv-id JOB, the same on every node and new for every job")
	}
	if lo, hi, err = ParseNNodes(r.NNodes); err != nil {
		return 0, 0, 0, err
	}
	rank = -1
	if r.NodeRank != "" && r.NodeRank != "auto" {
		if rank, err = strconv.Atoi(r.NodeRank); err != nil || rank < 0 || rank >= hi {
			return 0, 0, 0, usage.Errorf("run: --node-rank %q: want auto or 0 to %d (--nnodes %s)", r.NodeRank, hi-1, r.NNodes)
		}
	}
	if r.RendezvousBackend != rendezvous.BackendEtcd {
		if _, _, err := net.SplitHostPort(r.RendezvousEndpoint); err != nil {
			return 0, 0, 0, usage.Errorf("run: --rdzv-endpoint %q: want HOST:PORT of the node hosting the c10d rendezvous", r.RendezvousEndpoint)
		}
	}
	return lo, hi, rank, nil
}

// readSecret reads the job secret every node of a per-node job shares:
// --rdzv-secret-file, else GTRAIN_RDZV_SECRET. torchrun's c10d has none;
// gtrain refuses to run a job anyone on the network could join.
func (r *Request) readSecret(ctx context.Context) ([]byte, error) {
	var s []byte
	from := SecretEnv
	if r.SecretFile != "" {
		b, err := readUserFile(ctx, r.SecretFile, maxSecretFile)
		if err != nil {
			return nil, err
		}
		s, from = b, r.SecretFile
	} else {
		getenv := r.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		s = []byte(getenv(SecretEnv))
	}
	s = []byte(strings.TrimSpace(string(s)))
	switch {
	case len(s) == 0:
		return nil, usage.Errorf("run: per-node mode needs the job secret, the same on every node: --rdzv-secret-file FILE or %s (e.g. head -c 32 /dev/urandom | base64 > FILE); gtrain does not run a job anyone on the network could join", SecretEnv)
	case len(s) < 16:
		return nil, usage.Errorf("run: the job secret from %s has %d bytes: want at least 16 (e.g. head -c 32 /dev/urandom | base64)", from, len(s))
	}
	return s, nil
}

// perNode is this node's connection to a per-node job.
type perNode struct {
	store    rendezvous.Backend
	endpoint string
	secret   []byte
	min, max int
	server   *rendezvous.Server     // the c10d rendezvous, when this node hosts it
	etcd     *rendezvous.EtcdConfig // the etcd cluster, for the attempts' rounds
	rdzvHost string                 // c10d: the host agents dial
	bind     string                 // c10d: where attempt servers listen
	base     JobOptions             // the job but its nodes
	first    int                    // the first round of this node's run of the job (pernode_run.go)
}

// RunPerNode runs this node's part of a per-node job whose ranks run w,
// showing it in view; abort is Runtime.Abort. It returns nil when every
// rank of every node exited 0.
func (r *Request) RunPerNode(ctx context.Context, w Workload, view status.View, abort <-chan struct{}) error {
	pn, me, err := r.joinPerNode(ctx, w)
	if err != nil {
		return announced(view, err)
	}
	defer pn.close()
	local, err := NewLocal()
	if err != nil {
		return announced(view, err)
	}
	return pn.attempts(ctx, r, pn.base, me, Runtime{Transport: local, View: view, LogDir: r.LogDir, Abort: abort,
		JoinTimeout: r.JoinTimeout, HangTimeout: r.HangTimeout, StragglerFactor: r.StragglerFactor,
		RestartJitter: restartJitter, Etcd: pn.etcd, RendezvousHost: pn.rdzvHost, Plan: r.Plan})
}

// joinPerNode checks the request, reads the secret and connects to the
// job's store.
func (r *Request) joinPerNode(ctx context.Context, w Workload) (*perNode, nodeInfo, error) {
	lo, hi, rank, err := r.CheckPerNode()
	if err != nil {
		return nil, nodeInfo{}, err
	}
	if err := r.ResolveNproc(ctx); err != nil {
		return nil, nodeInfo{}, err
	}
	secret, err := r.readSecret(ctx)
	if err != nil {
		return nil, nodeInfo{}, err
	}
	base, err := r.perNodeBase(ctx, w)
	if err != nil {
		return nil, nodeInfo{}, err
	}
	pn, err := r.openPerNode(ctx, secret, lo, hi)
	if err != nil {
		return nil, nodeInfo{}, err
	}
	pn.base = base
	me, err := r.nodeInfo(pn, cmp.Or(w.NprocPerNode, r.NprocPerNode), rank)
	if err != nil {
		pn.close()
		return nil, nodeInfo{}, err
	}
	me.Job = w.Digest
	return pn, me, nil
}

// perNodeBase is the job's options but its nodes: the command, the env
// file and --env, the working directory.
func (r *Request) perNodeBase(ctx context.Context, w Workload) (JobOptions, error) {
	var fileEnv []string
	var err error
	if r.EnvFile != "" {
		if fileEnv, err = ReadEnvFile(ctx, r.EnvFile); err != nil {
			return JobOptions{}, err
		}
	}
	dir, err := r.WorkDir()
	if err != nil {
		return JobOptions{}, err
	}
	env := slices.Concat(fileEnv, r.Env, w.Env)
	if err := checkUserEnv(env); err != nil {
		return JobOptions{}, err
	}
	return JobOptions{Command: w.Command, MasterAddr: r.MasterAddr, MasterPort: r.MasterPort, RunID: r.RunID,
		MaxRestarts: r.MaxRestarts, Grace: r.Grace, Heartbeat: r.Heartbeat, Dir: dir, Env: env,
		Forward: ForwardEnv(os.Environ()), Getenv: r.Getenv, Bind: r.Bind}, nil
}

// nodeInfo is what this node says of itself in each round: its name
// (--local-addr, else the hostname) and address (--local-addr, else its
// address on the route to the rendezvous).
func (r *Request) nodeInfo(pn *perNode, nproc, rank int) (nodeInfo, error) {
	name := r.LocalAddr
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nodeInfo{}, fmt.Errorf("run: this node's name: %w (give --local-addr)", err)
		}
		name = h
	}
	addr := r.LocalAddr
	if addr == "" {
		addr = hostOnly(pn.store.LocalAddr())
	}
	return nodeInfo{Name: name, Addr: addr, Nproc: nproc, Rank: rank, MaxRestarts: r.MaxRestarts, StoreHost: pn.server != nil}, nil
}

// attempts runs the job's attempts on this node until one succeeds, one
// fails for good, or the restarts (counted job-wide) are spent.
func (pn *perNode) attempts(ctx context.Context, _ *Request, base JobOptions, me nodeInfo, rt Runtime) error {
	rt.setDefaults()
	local := rt.Transport
	start, err := pn.findRun(ctx)
	if err != nil {
		var je *jobEndedError
		if errors.As(err, &je) {
			return pn.leave(ctx, rt.View, me.Name, err)
		}
		return announced(rt.View, err)
	}
	for n := start; ; n++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		me.Port = port
		members, mine, err := pn.meetRound(ctx, n, me, rt.JoinTimeout)
		if errors.Is(err, errSpare) {
			notice(rt.View, fmt.Sprintf("round %d closed without this one (--nnodes %d:%d): waiting as a spare for the next round", n, pn.min, pn.max))
			if err = pn.waitRound(ctx, n+1); err == nil {
				continue
			}
		}
		if errors.Is(err, errReplaced) {
			// The job goes on with the node that replaced this one: no end.
			return announced(rt.View, err)
		}
		var je *jobEndedError
		if err != nil && !errors.As(err, &je) {
			return pn.leave(ctx, rt.View, me.Name, announced(rt.View, err))
		}
		if err != nil {
			return pn.leave(ctx, rt.View, me.Name, err)
		}
		p, err := perNodeJob(base, members, mine)
		if err != nil {
			return pn.leave(ctx, rt.View, me.Name, announced(rt.View, err))
		}
		notice(rt.View, fmt.Sprintf("node %s is node %d of %d (%d ranks in all, attempt %d): %s", me.Name, mine, len(members), p.WorldSize, n, nodeNames(members)))
		na := newNodeAttempt(ctx, pn, n, mine, members, rt.beat(p))
		na.run()
		art := rt
		art.Transport = &nodeTransport{local: local, na: na}
		art.meet = pn.meet
		planned := &plannedState{}
		art.Plan = planned.wrap(rt.Plan, members)
		announceAttempt(rt.View, n, p)
		err, _ = runAttempt(ctx, p, art, n)
		me.Plan, me.PlanAttempt = planned.after(me.Plan, me.PlanAttempt, n)
		na.cancel()
		if err == nil || !restartable(err) || na.final || n-pn.first >= p.MaxRestarts || ctx.Err() != nil {
			return pn.leave(ctx, rt.View, me.Name, err)
		}
		wait := rt.restartWait(n - pn.first)
		notice(rt.View, fmt.Sprintf("%v; restarting the job in %v (restart %d of %d)", err, wait.Round(10*time.Millisecond), n-pn.first+1, p.MaxRestarts))
		if err := sleepCtx(ctx, wait); err != nil {
			return pn.leave(ctx, rt.View, me.Name, announced(rt.View, jobStopped(err)))
		}
	}
}

// beat is the interval of the nodes' heartbeats in the store.
func (rt *Runtime) beat(p *Job) time.Duration {
	return cmp.Or(p.Heartbeat, 5*time.Second)
}

// waitRound waits until another node starts round n, or the job ends; a
// store that fails every request for the outage limit ends the wait
// (watchStore), which would otherwise last for ever.
func (pn *perNode) waitRound(ctx context.Context, n int) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go pn.watchStore(wctx, cmp.Or(pn.base.Heartbeat, 5*time.Second), cancel)
	_, err := pn.waitNext(wctx, n, 1, nil)
	return err
}

func nodeNames(ms []nodeInfo) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return strings.Join(names, ", ")
}

// perNodeJob is the job of a closed round: its members in rank order,
// each with its own ranks; this node (mine) is the only local host.
func perNodeJob(o JobOptions, members []nodeInfo, mine int) (*Job, error) {
	for _, m := range members {
		slots := make([]int, m.Nproc)
		for i := range slots {
			slots[i] = i
		}
		o.Nodes = append(o.Nodes, hostfiles.Node{Host: hostfiles.Host{Name: m.Name, Slots: m.Nproc}, SlotIDs: slots})
	}
	o.MasterAddr = cmp.Or(o.MasterAddr, members[0].Addr)
	o.MasterPort = cmp.Or(o.MasterPort, members[0].Port)
	p, err := NewJob(o)
	if err != nil {
		return nil, err
	}
	for i := range p.Hosts {
		p.Hosts[i].Local = i == mine
	}
	return p, nil
}

// leave records the job's end for the other nodes (and later comers) and
// returns err: the first end written is the job's. A job found over
// already is this node's end too: nil when it finished well.
func (pn *perNode) leave(ctx context.Context, v status.View, me string, err error) error {
	var je *jobEndedError
	if errors.As(err, &je) {
		notice(v, je.Error())
		if je.end.OK {
			return nil
		}
		return err
	}
	e := jobEnd{OK: err == nil, By: me}
	if err != nil {
		e.Reason = err.Error()
	}
	pn.end(ctx, e)
	return err
}

// announced announces an error no attempt announced, and returns it.
func announced(v status.View, err error) error {
	notice(v, err.Error())
	return err
}
