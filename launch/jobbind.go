package launch

import (
	"sync"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// bindsCPUs reports whether the job's ranks get CPU bindings, and with
// them OMP_NUM_THREADS from their agent.
func (p *Job) bindsCPUs() bool { return p.Bind != "" && p.Bind != BindNone }

// planLocalBinds plans, for --dry-run to show, the binding of every rank
// on this machine, as its agent will at launch. A binding this machine
// cannot give (more ranks than cores under --bind core) is a usage error
// now rather than a failed launch.
func (p *Job) planLocalBinds(o JobOptions) error {
	if !p.bindsCPUs() || o.LocalHost == nil {
		return nil
	}
	var h *hostinfo.Host
	for _, host := range p.Hosts {
		if !host.Local {
			continue
		}
		if h == nil {
			h = o.LocalHost()
		}
		bs, err := PlanHostBinding(h, host.Name, p.Bind, host.Slots)
		if err != nil {
			return &usage.Error{Err: err}
		}
		p.attachBinds(host.Node, bs, o)
	}
	return nil
}

// attachBinds gives node's ranks their bindings, showing only the
// variables the user has not set (with --env or in the launcher's
// environment), which the agent leaves alone.
func (p *Job) attachBinds(node int, bs []Binding, o JobOptions) {
	for i := range p.Ranks {
		r := &p.Ranks[i]
		if r.Node != node || r.LocalRank >= len(bs) {
			continue
		}
		b := bs[r.LocalRank]
		env := map[string]string{}
		for k, v := range b.Env {
			if _, set := r.Env[k]; !set && o.Getenv(k) == "" {
				env[k] = v
			}
		}
		b.Env = env
		r.Bind = &b
	}
}

// joinedFacts is what each node's agent detected, by node, as its joined
// event reported it.
type joinedFacts struct {
	mu    sync.Mutex
	hosts map[int]*hostinfo.Host
}

// SetHostFacts records what node's agent detected of its host.
func (p *Job) SetHostFacts(node int, h *hostinfo.Host) {
	if p.facts == nil || h == nil {
		return
	}
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	if p.facts.hosts == nil {
		p.facts.hosts = map[int]*hostinfo.Host{}
	}
	p.facts.hosts[node] = h
}

// HostFacts is what the agents of the job's hosts detected, by node (the
// host's index), once they joined: nil for a host whose agent has not
// joined, or detected nothing. A planner reads the real cluster here.
func (p *Job) HostFacts() []*hostinfo.Host {
	out := make([]*hostinfo.Host, len(p.Hosts))
	if p.facts == nil {
		return out
	}
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	for n, h := range p.facts.hosts {
		if n >= 0 && n < len(out) {
			out[n] = h
		}
	}
	return out
}
