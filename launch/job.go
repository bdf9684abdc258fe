package launch

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
)

// DefaultRole is the role name every rank gets (torchrun's default).
const DefaultRole = "default"

// JobOptions describe a job before NewJob resolves it.
type JobOptions struct {
	Nodes        []hostfiles.Node // where to run, in node-rank order
	FromHostfile bool             // Nodes came from a hostfile: slots are device ids (CUDA_VISIBLE_DEVICES)
	Command      []string
	MasterAddr   string        // "" = 127.0.0.1 on this machine alone, else determined at launch
	MasterPort   int           // 0 = a free port: picked now on this machine alone, else by node 0 at launch
	RunID        string        // "" = a fresh random id
	MaxRestarts  int           // whole-job restarts after a failure
	Grace        time.Duration // SIGTERM → SIGKILL
	Heartbeat    time.Duration // agent heartbeat interval
	Dir          string        // working directory of the ranks
	Env          []string      // KEY=VALUE for every rank (--env, --env-file): part of the contract shown by --dry-run
	Forward      []string      // KEY=VALUE from the launcher's environment for every rank on every host (ForwardEnv)
	Getenv       func(string) string
	// Bind is what each rank is bound to (--bind); "" binds nothing.
	Bind BindMode
	// LocalHost detects this machine, so the job shows the binding of the
	// ranks on it (an agent plans its own host's binding alike at launch);
	// nil shows none.
	LocalHost func() *hostinfo.Host
}

// Job is a job resolved down to every rank and its environment. It is what
// `gtrain run --dry-run` prints and what Run executes.
type Job struct {
	RunID       string        `json:"run_id"`
	Command     []string      `json:"command"`
	MasterAddr  string        `json:"master_addr"` // "" = determined at launch
	MasterPort  int           `json:"master_port"` // 0 = picked by node 0 at launch
	WorldSize   int           `json:"world_size"`
	MaxRestarts int           `json:"max_restarts"`
	Grace       time.Duration `json:"-"`
	Heartbeat   time.Duration `json:"-"`
	Dir         string        `json:"dir,omitempty"`
	Forward     []string      `json:"forward,omitempty"`
	Bind        BindMode      `json:"bind,omitempty"` // --bind; agents plan it on their hosts
	Hosts       []Host        `json:"hosts"`
	Ranks       []Rank        `json:"ranks"`
	// Elastic is the job's elastic membership (run --nnodes); nil: every
	// attempt runs on the same hosts.
	Elastic *Elastic `json:"elastic,omitempty"`

	facts *joinedFacts // what the agents detected, once they joined
	opts  JobOptions   // what NewJob made it from: an elastic restart remakes it on other hosts
}

// Host is one node of the job.
type Host struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	User  string `json:"user,omitempty"`
	Node  int    `json:"node"`
	Slots []int  `json:"slots"`
	Local bool   `json:"local"` // this machine: started without SSH
}

// Rank is one rank and the environment gtrain gives it (on top of the
// environment the agent itself runs in).
type Rank struct {
	Rank      int               `json:"rank"`
	Host      string            `json:"host"`
	Node      int               `json:"node"`
	LocalRank int               `json:"local_rank"`
	Slot      int               `json:"slot"`
	Env       map[string]string `json:"env"`
	// Bind is the binding its agent will apply (Env shows none of it), as
	// planned now for a rank on this machine; nil elsewhere, where the
	// host's agent plans it from its hardware at launch.
	Bind *Binding `json:"bind,omitempty"`
}

// contractVars are the variables gtrain sets for every rank; --env may not
// override them.
var contractVars = []string{
	rankenv.Rank, rankenv.LocalRank, rankenv.WorldSize, rankenv.LocalWorldSize,
	rankenv.GroupRank, rankenv.GroupWorldSize, rankenv.RoleRank, rankenv.RoleName, rankenv.RoleWorldSize,
	rankenv.MasterAddr, rankenv.MasterPort,
	rankenv.RestartCount, rankenv.MaxRestarts, rankenv.RunID, rankenv.UseAgentStore, rankenv.ErrorFile,
	rankenv.GtrainRunID, rankenv.Host, rankenv.Slot, rankenv.Attempt, rankenv.StatusFD,
	rankenv.StoreAddr, rankenv.StoreSecretFile,
}

// NewJob resolves o into a Job: it numbers ranks (hosts in order, slots in
// order; node rank = host index), picks the master address and port and a run
// id when not given, and computes each rank's environment for attempt 0.
func NewJob(o JobOptions) (*Job, error) {
	if len(o.Command) == 0 {
		return nil, errors.New("launch: no command to run")
	}
	if len(o.Nodes) == 0 {
		return nil, errors.New("launch: no hosts to run on")
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if err := checkUserEnv(o.Env); err != nil {
		return nil, err
	}
	p := &Job{
		RunID: o.RunID, Command: o.Command, MasterAddr: o.MasterAddr, MasterPort: o.MasterPort,
		MaxRestarts: o.MaxRestarts, Grace: o.Grace, Heartbeat: o.Heartbeat, Dir: o.Dir, Forward: o.Forward,
		Bind: o.Bind, facts: &joinedFacts{}, opts: o,
	}
	if p.RunID == "" {
		p.RunID = newRunID()
	}
	for i, n := range o.Nodes {
		p.Hosts = append(p.Hosts, Host{Name: n.Name, Addr: n.Addr(), User: n.User, Node: i,
			Slots: n.SlotIDs, Local: IsLocalHost(n.Name)})
		p.WorldSize += len(n.SlotIDs)
	}
	// On this machine alone, the master is known now. With remote hosts it is
	// determined at launch (see Job.master): the address the other nodes
	// reach node 0 at, and a port node 0 itself found free.
	if p.allLocal() {
		if p.MasterAddr == "" {
			p.MasterAddr = "127.0.0.1"
		}
		if p.MasterPort == 0 {
			port, err := FreePort()
			if err != nil {
				return nil, err
			}
			p.MasterPort = port
		}
	}
	p.Ranks = p.rankTable(o)
	if err := p.planLocalBinds(o); err != nil {
		return nil, err
	}
	return p, nil
}

// rankTable numbers the ranks and builds their environments.
func (p *Job) rankTable(o JobOptions) []Rank {
	var ranks []Rank
	for _, h := range p.Hosts {
		for local, slot := range h.Slots {
			r := Rank{Rank: len(ranks), Host: h.Name, Node: h.Node, LocalRank: local, Slot: slot}
			r.Env = p.environFor(r, h, o)
			ranks = append(ranks, r)
		}
	}
	return ranks
}

// environFor is the environment the launcher writes for rank r (attempt
// 0): the torchrun contract, gtrain's own variables and the user's --env.
// The engine's ranks read it back (engine/train, engine/dist).
func (p *Job) environFor(r Rank, h Host, o JobOptions) map[string]string {
	itoa := strconv.Itoa
	env := map[string]string{}
	for _, kv := range o.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	set := map[string]string{
		rankenv.Rank: itoa(r.Rank), rankenv.LocalRank: itoa(r.LocalRank),
		rankenv.WorldSize: itoa(p.WorldSize), rankenv.LocalWorldSize: itoa(len(h.Slots)),
		rankenv.GroupRank: itoa(h.Node), rankenv.GroupWorldSize: itoa(len(p.Hosts)),
		rankenv.RoleRank: itoa(r.Rank), rankenv.RoleName: DefaultRole, rankenv.RoleWorldSize: itoa(p.WorldSize),
		rankenv.RestartCount: "0", rankenv.MaxRestarts: itoa(p.MaxRestarts),
		rankenv.RunID: p.RunID, rankenv.UseAgentStore: "False",
		rankenv.GtrainRunID: p.RunID, rankenv.Host: h.Name, rankenv.Slot: itoa(r.Slot), rankenv.Attempt: "0",
	}
	if p.MasterAddr != "" {
		set[rankenv.MasterAddr] = p.MasterAddr
	}
	if p.MasterPort != 0 {
		set[rankenv.MasterPort] = itoa(p.MasterPort)
	}
	for k, v := range set {
		env[k] = v
	}
	// As torchrun (PyTorch 2.2 and later, checked against 2.11's): NCCL's
	// watchdog handles a failed collective unless the user chose. A choice
	// under the old name stands alone: the new one beside it would
	// override it (and PyTorch warns whenever the old name is set, so
	// gtrain sets only the new).
	chosen := userSet(env, o, rankenv.AsyncErrorHandling)
	if old := userSet(env, o, rankenv.AsyncErrorHandlingOld); !chosen && !old {
		env[rankenv.AsyncErrorHandling] = "1"
	}
	if !userSet(env, o, rankenv.SignalsToHandle) {
		env[rankenv.SignalsToHandle] = rankenv.DefaultSignalsToHandle
	}
	// torchrun: one OpenMP thread per rank when several share a host and the
	// user set none, so N ranks do not each spawn a thread per core.
	if !userSet(env, o, "OMP_NUM_THREADS") && len(h.Slots) > 1 && !p.bindsCPUs() {
		env["OMP_NUM_THREADS"] = "1"
	}
	// DeepSpeed's launcher: a hostfile's slots are device ids; every rank of
	// the node sees the node's selected devices and picks its own by
	// LOCAL_RANK. Under --bind gpu the agent narrows it to the rank's own.
	if _, ok := env["CUDA_VISIBLE_DEVICES"]; !ok && o.FromHostfile && p.Bind != BindGPU {
		env["CUDA_VISIBLE_DEVICES"] = joinInts(h.Slots)
	}
	return env
}

// RankEnv returns rank r's environment for the given attempt as sorted
// KEY=VALUE entries.
func (p *Job) RankEnv(r Rank, attempt int) []string {
	out := make([]string, 0, len(r.Env))
	for k, v := range r.Env {
		switch k {
		case rankenv.RestartCount, rankenv.Attempt:
			v = strconv.Itoa(attempt)
		}
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// checkUserEnv validates --env entries.
func checkUserEnv(env []string) error {
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\n") {
			return usage.Errorf("launch: --env %q: want KEY=VALUE", kv)
		}
		for _, c := range contractVars {
			if k == c {
				return usage.Errorf("launch: --env %s: gtrain sets %s for every rank; it cannot be overridden", k, k)
			}
		}
	}
	return nil
}

// allLocal reports whether every host of the job is this machine.
func (p *Job) allLocal() bool {
	for _, h := range p.Hosts {
		if !h.Local {
			return false
		}
	}
	return true
}

// IsLocalHost reports whether a hostfile name means this machine:
// "localhost", a loopback address, or this machine's hostname.
func IsLocalHost(name string) bool {
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if name == "localhost" {
		return true
	}
	if ip := net.ParseIP(name); ip != nil {
		return ip.IsLoopback()
	}
	self, err := os.Hostname()
	return err == nil && strings.EqualFold(name, self)
}

// FreePort returns a TCP port that was free on all interfaces a moment ago,
// so concurrent jobs on one machine do not all fight over 29500.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("launch: pick a free master port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// NewRunID returns a fresh run id, the one Options.RunID "" stands for:
// for a caller that must name the job before its Job is made.
func NewRunID() string { return newRunID() }

// newRunID returns a random UUID (version 4), the form torchrun's
// --standalone uses for TORCHELASTIC_RUN_ID.
func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Assignment is what the agent of node i is told to run in the given attempt.
func (p *Job) Assignment(i, attempt int) *proto.Assignment {
	h := p.Hosts[i]
	s := &proto.Assignment{
		V: proto.Version, RunID: p.RunID, Attempt: attempt, Node: h.Node, Host: h.Name,
		Command: p.Command, Dir: p.Dir, Env: p.Forward, GraceMillis: p.Grace.Milliseconds(),
		BeatMillis: p.Heartbeat.Milliseconds(), StatusFD: true, ErrorFiles: true, WaitStart: true,
		LauncherBeats: p.Heartbeat > 0, Bind: string(p.Bind),
	}
	for _, r := range p.Ranks {
		if r.Node == h.Node {
			s.Ranks = append(s.Ranks, proto.RankAssignment{Rank: r.Rank, LocalRank: r.LocalRank, Slot: r.Slot, Env: p.RankEnv(r, attempt)})
		}
	}
	return s
}

// userSet reports whether the user chose variable k, with --env or in the
// launcher's environment; the latter is copied into env, so that it reaches
// ranks on other hosts too.
func userSet(env map[string]string, o JobOptions, k string) bool {
	if _, ok := env[k]; ok {
		return true
	}
	if v := o.Getenv(k); v != "" {
		env[k] = v
		return true
	}
	return false
}
