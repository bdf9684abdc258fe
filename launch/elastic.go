package launch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
)

// Elastic membership (run --nnodes MIN:MAX, torchrun's spelling): a job
// runs on at most MAX of its hostfile's hosts, the rest are spares. After a
// restartable failure the launcher drops the hosts to blame, brings spares
// in and restarts on every host still healthy, as long as MIN remain.

// DefaultMaxHostFailures is how many failures blamed on one host exclude it
// for the rest of a job (--max-host-failures): one fault can be transient
// (a flaky link, a rank killed by the OOM killer once), a third on the same
// host is the host.
const DefaultMaxHostFailures = 3

// restartJitter is the random share gtrain adds to each wait before a
// restart (Runtime.RestartJitter): up to 10% more, so that jobs that
// failed together (a switch went down) do not restart in step.
const restartJitter = 0.1

// maxProbe bounds the check, at a restart, that a lost host or a spare is
// reachable again (an SSH handshake); they are checked together.
const maxProbe = 10 * time.Second

// Elastic is a job's elastic membership: it runs on Min to Max hosts of
// Pool (the hostfile's selected hosts, in order: the first Max start, the
// rest are spares).
type Elastic struct {
	Min int `json:"min"`
	Max int `json:"max"`
	// MaxHostFailures excludes a host for the rest of the job once this
	// many failures were blamed on it (0: DefaultMaxHostFailures).
	MaxHostFailures int              `json:"max_host_failures,omitempty"`
	Spares          []string         `json:"spares,omitempty"` // names of the hosts that start as spares
	Pool            []hostfiles.Node `json:"-"`
}

// ParseNNodes parses --nnodes: "N" (N:N) or "MIN:MAX", torchrun's spelling.
func ParseNNodes(s string) (lo, hi int, err error) {
	a, b, two := strings.Cut(s, ":")
	if _, err = fmt.Sscan(a, &lo); err == nil && two {
		_, err = fmt.Sscan(b, &hi)
	} else {
		hi = lo
	}
	switch {
	case err != nil || strings.ContainsAny(s, " \t+"):
		return 0, 0, usage.Errorf("run: --nnodes %q: want N or MIN:MAX, as torchrun (2:4 runs on 2 to 4 hosts)", s)
	case lo < 1 || hi < lo || hi > hostfiles.MaxHosts:
		return 0, 0, usage.Errorf("run: --nnodes %q: want 1 ≤ MIN ≤ MAX ≤ %d", s, hostfiles.MaxHosts)
	}
	return lo, hi, nil
}

// elasticNodes splits a hostfile's selected nodes for --nnodes lo:hi: the
// first hi start, the rest are spares. Fewer than lo is a usage error.
func elasticNodes(nodes []hostfiles.Node, lo, hi, maxFails int) ([]hostfiles.Node, *Elastic, error) {
	if len(nodes) < lo {
		return nil, nil, usage.Errorf("run: --nnodes %d:%d: the hostfile selects %d host(s), fewer than the minimum %d: add hosts or lower the minimum",
			lo, hi, len(nodes), lo)
	}
	if maxFails < 0 {
		return nil, nil, usage.Errorf("run: --max-host-failures %d: must be 1 or more (0: the default, %d)", maxFails, DefaultMaxHostFailures)
	}
	e := &Elastic{Min: lo, Max: hi, MaxHostFailures: maxFails, Pool: nodes}
	start := nodes[:min(hi, len(nodes))]
	for _, n := range nodes[len(start):] {
		e.Spares = append(e.Spares, n.Name)
	}
	return start, e, nil
}

// hostHealth is what the launcher knows of one host of the pool.
type hostHealth struct {
	fails    int
	last     string // why it failed last
	excluded bool   // for the rest of the job
	lostAt   int    // the attempt it was last lost in; -1 never
}

// blame is a failure the end of an attempt puts on one of its nodes.
type blame struct {
	node int
	why  string
	// lost: the host was unreachable, or hung the job; it sits out the next
	// attempt if the job can do without it.
	lost bool
}

// membership chooses each attempt's hosts from an elastic job's pool.
type membership struct {
	e      *Elastic
	health []hostHealth
	cur    []int // pool index of each node of the attempt running now
	maxF   int
}

func newMembership(p *Job) *membership {
	e := p.Elastic
	m := &membership{e: e, health: make([]hostHealth, len(e.Pool)), maxF: e.MaxHostFailures}
	if m.maxF <= 0 {
		m.maxF = DefaultMaxHostFailures
	}
	for i := range m.health {
		m.health[i].lostAt = -1
	}
	for _, h := range p.Hosts {
		m.cur = append(m.cur, m.index(h.Name))
	}
	return m
}

// index is the pool index of the host named name.
func (m *membership) index(name string) int {
	return slices.IndexFunc(m.e.Pool, func(n hostfiles.Node) bool { return n.Name == name })
}

// record charges the attempt's failures to their hosts and announces the
// hosts it drops or excludes.
func (m *membership) record(v eventSink, attempt int, bl []blame) {
	for _, b := range bl {
		if b.node < 0 || b.node >= len(m.cur) {
			continue
		}
		i := m.cur[b.node]
		h := &m.health[i]
		h.fails++
		h.last = b.why
		if b.lost {
			h.lostAt = attempt
		}
		name := m.e.Pool[i].Name
		switch {
		case h.fails >= m.maxF && !h.excluded:
			h.excluded = true
			hostEvent(v, proto.EventHostDropped, name, fmt.Sprintf("excluded for the rest of the job: %d failures (--max-host-failures %d), the last: %s", h.fails, m.maxF, b.why))
		case b.lost:
			hostEvent(v, proto.EventHostDropped, name, "dropped from the next attempt: "+b.why)
		}
	}
}

// next chooses the hosts of attempt n, once attempt n-1 has failed: the
// healthy hosts of the last attempt, then spares and hosts lost before the
// last attempt that answer a probe, up to Max; the hosts lost in the last
// attempt only if the job needs them to reach Min and they answer. Fewer
// than Min is an error naming the hosts lost and why.
func (m *membership) next(ctx context.Context, tr Transport, v eventSink, n int) ([]int, error) {
	var chosen, fresh, recent []int
	for i := range m.e.Pool {
		h := m.health[i]
		switch {
		case h.excluded:
		case h.lostAt == n-1:
			recent = append(recent, i)
		case slices.Contains(m.cur, i) && h.lostAt < 0:
			chosen = append(chosen, i)
		default:
			fresh = append(fresh, i) // a spare, or back from an older loss
		}
	}
	if room := m.e.Max - len(chosen); room > 0 {
		chosen = append(chosen, m.reachable(ctx, tr, fresh, room)...)
	}
	if need := m.e.Min - len(chosen); need > 0 {
		chosen = append(chosen, m.reachable(ctx, tr, recent, need)...)
	}
	if len(chosen) < m.e.Min {
		return nil, m.tooFew(len(chosen))
	}
	slices.Sort(chosen)
	for _, i := range chosen {
		if !slices.Contains(m.cur, i) {
			why := "a spare"
			if m.health[i].lostAt >= 0 {
				why = "reachable again"
			}
			hostEvent(v, proto.EventHostAdded, m.e.Pool[i].Name, "joins attempt "+fmt.Sprint(n)+": "+why)
		}
	}
	return chosen, nil
}

// reachable is up to want of the pool hosts idx (in order) that answer a
// probe within maxProbe; a host that answers is no longer counted lost.
func (m *membership) reachable(ctx context.Context, tr Transport, idx []int, want int) []int {
	if len(idx) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, maxProbe)
	defer cancel()
	ok := make([]bool, len(idx))
	var wg sync.WaitGroup
	for k, i := range idx {
		wg.Go(func() { ok[k] = probe(ctx, tr, poolHost(m.e.Pool[i])) == nil })
	}
	wg.Wait()
	var out []int
	for k, i := range idx {
		if ok[k] && len(out) < want {
			out = append(out, i)
		}
	}
	return out
}

// tooFew is the error of a job left with fewer than Min hosts.
func (m *membership) tooFew(have int) error {
	var lost []string
	for i, h := range m.health {
		if h.fails == 0 {
			continue
		}
		state := "unreachable"
		if h.excluded {
			state = "excluded"
		} else if h.lostAt < 0 {
			state = "failed"
		}
		lost = append(lost, fmt.Sprintf("%s (%s after %d failure(s): %s)", m.e.Pool[i].Name, state, h.fails, h.last))
	}
	return &ElasticError{Have: have, Min: m.e.Min, Lost: lost}
}

// ElasticError is an elastic job left with fewer hosts than --nnodes'
// minimum: Lost names the hosts it lost, each with why.
type ElasticError struct {
	Have, Min int
	Lost      []string
}

func (e *ElasticError) Error() string {
	return fmt.Sprintf("launch: elastic: %d healthy host(s) left, fewer than the --nnodes minimum %d; lost: %s",
		e.Have, e.Min, strings.Join(e.Lost, "; "))
}

// poolHost is a pool node as a Host to probe.
func poolHost(n hostfiles.Node) Host {
	return Host{Name: n.Name, Addr: n.Addr(), User: n.User, Node: -1, Slots: n.SlotIDs, Local: IsLocalHost(n.Name)}
}

// Prober is a Transport that can check a host is reachable without
// starting anything there.
type Prober interface {
	Probe(ctx context.Context, h Host) error
}

// probe checks h with tr's Probe; a transport that cannot probe counts
// every host as reachable (starting its agent will tell).
func probe(ctx context.Context, tr Transport, h Host) error {
	if p, ok := tr.(Prober); ok {
		return p.Probe(ctx, h)
	}
	return nil
}

// Probe implements Prober: this machine is always there.
func (l *Local) Probe(context.Context, Host) error { return nil }

// Probe implements Prober by the transport of h.
func (m *Mux) Probe(ctx context.Context, h Host) error {
	if h.Local {
		return probe(ctx, m.Local, h)
	}
	if m.Remote == nil {
		return errors.New("launch: no transport for remote host " + h.Name)
	}
	return probe(ctx, m.Remote, h)
}

// Probe implements Prober: an SSH handshake with h, closed at once.
func (s *SSH) Probe(ctx context.Context, h Host) error {
	c, err := s.dial(ctx, s.resolveTarget(ctx, h, h.User, hostPort(h)))
	if err != nil {
		return err
	}
	return c.Close()
}

// eventSink is where membership changes are reported (a status.View).
type eventSink interface{ Event(proto.Event) }

// hostEvent reports a change of membership: a typed event for JSON readers
// and a notice for people.
func hostEvent(v eventSink, typ, host, why string) {
	now := time.Now()
	v.Event(proto.Event{V: proto.Version, Type: typ, Time: now, Host: host, Node: -1, Rank: -1, Message: why})
	verb := map[string]string{proto.EventHostDropped: "dropped", proto.EventHostAdded: "added"}[typ]
	v.Event(proto.Event{V: proto.Version, Type: proto.EventNotice, Time: now, Host: host, Node: -1, Rank: -1,
		Message: fmt.Sprintf("elastic: %s host %s: %s", verb, host, why)})
}

// withNodes is p on the pool hosts idx (onNodes).
func (p *Job) withNodes(idx []int) (*Job, error) {
	var nodes []hostfiles.Node
	for _, i := range idx {
		nodes = append(nodes, p.Elastic.Pool[i])
	}
	return p.onNodes(nodes)
}

// remade is p made anew on its own hosts (onNodes).
func (p *Job) remade() (*Job, error) { return p.onNodes(p.opts.Nodes) }

// onNodes is p on nodes: ranks renumbered, every rank's environment made
// anew (WORLD_SIZE, and a fresh MASTER_PORT where gtrain picks it), the
// rest of the job unchanged.
func (p *Job) onNodes(nodes []hostfiles.Node) (*Job, error) {
	o := p.opts
	o.Nodes = nodes
	o.RunID, o.Command, o.MaxRestarts = p.RunID, p.Command, p.MaxRestarts
	o.Grace, o.Heartbeat = p.Grace, p.Heartbeat
	q, err := NewJob(o)
	if err != nil {
		return nil, err
	}
	q.Elastic = p.Elastic
	return q, nil
}

// sameHosts says whether the pool hosts idx are the job's, in order.
func (m *membership) sameHosts(idx []int) bool { return slices.Equal(idx, m.cur) }
