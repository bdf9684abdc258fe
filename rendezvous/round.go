package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
)

// Member is one node of a closed round.
type Member struct {
	Rank  int             `json:"rank"`  // node rank: the name's index in Config.Nodes
	Name  string          `json:"name"`  // the node's name, as the launcher's hostfile has it
	Addr  string          `json:"addr"`  // the IP the server saw the node's connection come from
	Facts json.RawMessage `json:"facts"` // the JSON object the node joined with, every field kept
}

// Facts are the host facts an agent joins with. Member.Facts keeps every
// field, these and any others.
type Facts struct {
	Hostname string `json:"hostname"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	CPUs     int    `json:"cpus"`
	// MasterPort is a port the node found free; the launcher uses rank 0's
	// as MASTER_PORT.
	MasterPort int `json:"master_port"`
}

// HostFacts decodes the known fields of m's facts.
func (m Member) HostFacts() (Facts, error) {
	var f Facts
	err := json.Unmarshal(m.Facts, &f)
	return f, err
}

// Round is the result of a join: every member in rank order, and the rank of
// the node that joined.
type Round struct {
	Rank    int
	Members []Member
}

// round is the server's membership round.
type round struct {
	nodes []string
	index map[string]int
	logf  func(string, ...any)

	mu     sync.Mutex
	slots  []*Member // by rank; nil = not joined
	joined int

	done    chan struct{} // closed when every node joined
	members []Member      // set before done is closed; read-only after
}

func newRound(nodes []string, logf func(string, ...any)) *round {
	r := &round{
		nodes: nodes, index: make(map[string]int, len(nodes)), logf: logf,
		slots: make([]*Member, len(nodes)), done: make(chan struct{}),
	}
	for i, n := range nodes {
		r.index[n] = i
	}
	if len(nodes) == 0 {
		r.members = []Member{}
		close(r.done)
	}
	return r
}

// join adds m and waits until the round closes. If ctx ends first (the
// agent gave up or its connection closed), m leaves the round again, so a
// restarted agent can join under the same name.
func (r *round) join(ctx context.Context, m Member) (int, []Member, error) {
	rank, err := r.add(m)
	if err != nil {
		return 0, nil, err
	}
	select {
	case <-r.done:
		return rank, r.members, nil
	case <-ctx.Done():
		if !r.withdraw(rank) {
			return rank, r.members, nil
		}
		return 0, nil, context.Cause(ctx)
	}
}

func (r *round) add(m Member) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rank, ok := r.index[m.Name]
	if !ok {
		return 0, errorf(codeUnknown, "unknown node %q: this job expects %s", clip(m.Name), listNames(r.nodes, 8))
	}
	if prev := r.slots[rank]; prev != nil {
		return 0, errorf(codeDuplicate, "node %s already joined (from %s); the first join stays", m.Name, prev.Addr)
	}
	m.Rank = rank
	m.Facts = bytes.Clone(m.Facts)
	r.slots[rank] = &m
	r.joined++
	r.logf("node %s joined from %s as rank %d (%d of %d)", m.Name, m.Addr, rank, r.joined, len(r.nodes))
	if r.joined == len(r.nodes) {
		r.members = make([]Member, len(r.slots))
		for i, s := range r.slots {
			r.members[i] = *s
		}
		r.logf("round closed: %d nodes", len(r.nodes))
		close(r.done)
	}
	return rank, nil
}

// withdraw takes rank out of a round that has not closed; false if it has.
func (r *round) withdraw(rank int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return false
	default:
	}
	r.logf("node %s left before the round closed", r.slots[rank].Name)
	r.slots[rank] = nil
	r.joined--
	return true
}

// missing returns the names of the nodes that have not joined, in order.
func (r *round) missing() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i, s := range r.slots {
		if s == nil {
			out = append(out, r.nodes[i])
		}
	}
	return out
}

func cloneMembers(ms []Member) []Member {
	out := make([]Member, len(ms))
	for i, m := range ms {
		m.Facts = bytes.Clone(m.Facts)
		out[i] = m
	}
	return out
}
