package launch

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/launch/proto"
)

// World is one attempt's membership as Runtime.Plan sees it, once every
// agent has joined: the hosts, what their agents detected, the ranks.
type World struct {
	Attempt int
	Hosts   []Host           // in node order
	Facts   []*hostinfo.Host // by node; nil where the agent detected nothing
	Size    int              // ranks in all
	Slots   []int            // ranks per node
	Bind    BindMode         // the job's --bind, which each agent plans from its facts ("" binds nothing)
	// State is the planner's state as the last attempt planned it
	// (Planned.State), carried through the rounds of a per-node job, in
	// which every node plans alike, nodes that joined late included; ""
	// for the first attempt, and under the SSH launcher, whose one
	// planner keeps its own.
	State string
}

// Planned is Runtime.Plan's answer for one attempt.
type Planned struct {
	Env   []string // KEY=VALUE for every rank, over the job's
	Notes []string // shown to the user as notices
	State string   // the planner's state after this attempt: World.State of the next, per node
}

// planResult is what Runtime.Plan returned for an attempt.
type planResult struct {
	Planned
	err error
}

// startRanks starts the ranks once every agent has joined: at once, or
// when Runtime.Plan has laid the job out for this world. Plan runs apart
// from the loop, which goes on beating and watching meanwhile.
func (a *attempt) startRanks() {
	if a.rt.Plan == nil {
		a.sendAll(proto.CommandStart, "", a.masterEnv()...)
		return
	}
	w := World{Attempt: a.n, Hosts: a.p.Hosts, Facts: a.p.HostFacts(), Size: a.p.WorldSize, Bind: a.p.Bind}
	for _, h := range a.p.Hosts {
		w.Slots = append(w.Slots, len(h.Slots))
	}
	go func() {
		pl, err := a.rt.Plan(a.ctx, w)
		a.planned <- planResult{pl, err}
	}()
}

// plannedStart starts the ranks with the plan's variables, or fails the
// job with its error.
func (a *attempt) plannedStart(r planResult) {
	for _, msg := range r.Notes {
		notice(a.view, msg)
	}
	switch {
	case r.err != nil:
		a.fail(r.err, "no plan: "+r.err.Error())
	case !a.stopping:
		a.sendAll(proto.CommandStart, "", append(a.masterEnv(), r.Env...)...)
	}
}

// blamed is what the attempt's end puts on its nodes: every lost agent
// (and every agent that never joined), a rank that failed on its own when
// no agent was lost, and the rank a hang's flight records blame.
func (a *attempt) blamed(err error) []blame {
	var out []blame
	for _, l := range a.lost {
		if l.Node >= 0 {
			out = append(out, blame{node: l.Node, why: "agent lost: " + l.Err.Error(), lost: true})
		}
	}
	for _, n := range a.missing {
		out = append(out, blame{node: n, why: fmt.Sprintf("agent did not join within %v", a.rt.JoinTimeout), lost: true})
	}
	var (
		rf   *RankFailedError
		hang *HangError
	)
	switch {
	case len(out) > 0:
	case errors.As(err, &rf) && !rf.PeerFailed && rf.Node >= 0:
		out = append(out, blame{node: rf.Node, why: rf.short()})
	case errors.As(err, &hang) && hang.Blamed:
		i := slices.IndexFunc(a.p.Ranks, func(r Rank) bool { return r.Rank == hang.Rank })
		if i >= 0 {
			out = append(out, blame{node: a.p.Ranks[i].Node, why: fmt.Sprintf("hang: the ranks waited for its rank %d", hang.Rank), lost: true})
		}
	}
	slices.SortStableFunc(out, func(x, y blame) int { return x.node - y.node })
	return out
}
