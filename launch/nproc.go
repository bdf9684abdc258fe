package launch

import (
	"cmp"
	"context"
	"fmt"
	"io"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// The counts --nproc-per-node takes besides a number, as torchrun.
const (
	NprocGPU  = "gpu"  // a rank per GPU of the host
	NprocAuto = "auto" // a rank per GPU, or per CPU on a host without GPUs
)

// CountSlots is the ranks --nproc-per-node from (gpu or auto) starts on
// host h: its GPUs, or under auto on a host without, the CPUs ranks may
// use there. torchrun's auto counts every CPU; gtrain keeps within the
// cgroup's cpuset and this process's affinity, as the binding does.
func CountSlots(h *hostinfo.Host, from string) (int, error) {
	return countSlots(h, from, processAffinity())
}

// countSlots is CountSlots within the CPUs own (nil: the host's usable
// CPUs, for a host whose agent's affinity the launcher does not know).
func countSlots(h *hostinfo.Host, from string, own []int) (int, error) {
	n := len(h.GPUs)
	switch {
	case n > 0:
	case from == NprocGPU:
		return 0, usage.Errorf("launch: host %s: --nproc-per-node gpu: the host has no GPUs (%s): give a number of ranks, or auto for one per CPU",
			hostName(h), cmp.Or(h.GPUError, "none detected"))
	default:
		cpus := usableCPUs(h)
		if len(own) > 0 {
			cpus = intersect(cpus, own)
		}
		n = len(cpus)
	}
	return min(max(n, 1), hostfiles.MaxSlotsPerHost), nil
}

// ResolveNproc counts the ranks of a run on this machine alone when
// --nproc-per-node said gpu or auto (detecting the machine); with a
// hostfile, its hosts' slots say how many, and Nodes counts those it
// lacks.
func (r *Request) ResolveNproc(ctx context.Context) error {
	if r.NprocFrom == "" || r.Hostfile != "" {
		return nil
	}
	n, err := CountSlots(DetectHost(ctx), r.NprocFrom)
	if err != nil {
		return err
	}
	r.NprocPerNode, r.NprocFrom = n, ""
	return nil
}

// readHostfile reads the hostfile; under --nproc-per-node gpu|auto a host
// written without slots gets as many as its hardware says: this machine
// counted here, a remote host by its agent (countRemote), as torchrun's
// agent counts its own node. Rank numbers follow the hostfile's order.
func (r *Request) readHostfile(ctx context.Context) ([]hostfiles.Host, error) {
	if r.NprocFrom == "" {
		return hostfiles.ReadFile(ctx, r.Hostfile)
	}
	var local *hostinfo.Host
	remote := map[string]bool{}
	hosts, err := hostfiles.ReadFileSlots(ctx, r.Hostfile, func(h hostfiles.Host) (int, error) {
		if !IsLocalHost(h.Name) {
			remote[h.Name] = true
			return 1, nil // until its agent has counted (countRemote)
		}
		if local == nil {
			local = DetectHost(ctx)
		}
		return CountSlots(local, r.NprocFrom)
	})
	if err != nil || len(remote) == 0 {
		return hosts, err
	}
	return r.countRemote(ctx, hosts, remote)
}

// countRemote sets the slots of the hosts named in remote, written
// without slots=, to what --nproc-per-node counts on the hardware their
// agents report: each such host the job can select has its agent started
// once, before the job, to detect and join (DetectHosts' round), and is
// stopped before any rank starts. A host that cannot be reached fails the
// job, naming it.
func (r *Request) countRemote(ctx context.Context, hosts []hostfiles.Host, remote map[string]bool) ([]hostfiles.Host, error) {
	if f := r.Filter; f.Include != "" || f.Exclude != "" {
		return nil, usage.Errorf("run: --hostfile %s: %s has no slots=, which --nproc-per-node %s counts on that host at launch; --include and --exclude select slots the hostfile gives: add slots=N for it",
			r.Hostfile, firstNamed(hosts, remote), r.NprocFrom)
	}
	candidates := hosts
	if n := r.Filter.NumNodes; n > 0 && n < len(hosts) {
		candidates = hosts[:n] // --num-nodes takes the first n: no other is asked
	}
	var ask []hostfiles.Node
	for _, h := range candidates {
		if _, done := r.slotsCounted[h.Name]; remote[h.Name] && !done {
			ask = append(ask, hostfiles.Node{Host: h, SlotIDs: []int{0}})
		}
	}
	if err := r.askSlots(ctx, ask); err != nil {
		return nil, err
	}
	out := make([]hostfiles.Host, len(hosts))
	copy(out, hosts)
	for i, h := range out {
		n, ok := r.slotsCounted[h.Name]
		if !remote[h.Name] || !ok {
			continue
		}
		if h.MaxSlots != 0 && n > h.MaxSlots {
			return nil, &hostfiles.ParseError{File: r.Hostfile, Line: h.Line,
				Msg: fmt.Sprintf("%q has %d slots by --nproc-per-node %s, more than its max_slots=%d: add slots=N", h.Name, n, r.NprocFrom, h.MaxSlots)}
		}
		out[i].Slots = n
	}
	return out, nil
}

// askSlots counts the slots of the nodes from what their agents report,
// into r.slotsCounted.
func (r *Request) askSlots(ctx context.Context, nodes []hostfiles.Node) error {
	if len(nodes) == 0 {
		return nil
	}
	facts, err := detectNodes(ctx, r, nodes)
	if err != nil {
		return fmt.Errorf("launch: --nproc-per-node %s: count the slots of %s: %w", r.NprocFrom, slotHostNames(nodes), err)
	}
	if r.slotsCounted == nil {
		r.slotsCounted = map[string]int{}
	}
	for i, n := range nodes {
		h := facts[i]
		h.Name = n.Name // messages name the host as the hostfile does
		c, err := countSlots(&h, r.NprocFrom, nil)
		if err != nil {
			return err
		}
		r.slotsCounted[n.Name] = c
	}
	return nil
}

// detectNodes is what the agents of nodes report, in their order, each
// agent started as a job's would and stopped once all have joined (a
// variable, so that tests can describe the hosts).
var detectNodes = func(ctx context.Context, r *Request, nodes []hostfiles.Node) ([]hostinfo.Host, error) {
	q := r.detecting()
	// The round is no part of the job: its logs and run id stay the job's.
	q.LogDir, q.RunID = "", ""
	dir, err := q.WorkDir()
	if err != nil {
		return nil, err
	}
	job, err := NewJob(JobOptions{Nodes: nodes, FromHostfile: true, Command: []string{"true"}, Grace: q.Grace,
		Heartbeat: q.Heartbeat, Dir: dir, Getenv: q.Getenv})
	if err != nil {
		return nil, err
	}
	return q.detectJob(ctx, job, io.Discard)
}

// firstNamed is the first of hosts named in names.
func firstNamed(hosts []hostfiles.Host, names map[string]bool) string {
	for _, h := range hosts {
		if names[h.Name] {
			return h.Name
		}
	}
	return ""
}

// slotHostNames lists the nodes' names for a message, the first few.
func slotHostNames(nodes []hostfiles.Node) string {
	const shown = 4
	s := ""
	for i, n := range nodes {
		if i == shown {
			return s + fmt.Sprintf(" and %d more", len(nodes)-shown)
		}
		if i > 0 {
			s += ", "
		}
		s += n.Name
	}
	return s
}
