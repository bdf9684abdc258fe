package launch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// The membership round of per-node mode (pernode.go), in the job's store
// so that both backends hold it alike. Under pernode/N/ for attempt N:
//
//	count      Add: each node's place in the order of joining (1, 2, ...)
//	member/I   the I-th node's nodeInfo (JSON)
//	closed     how many joined the round: the first to see MAX joined, or
//	           MIN joined and the last call over, writes it (CompareAndSet),
//	           and that count is the round, whoever else saw what
//
// Nodes that joined after the count are spares: they wait for the next
// round. The job's end (pernode/end) ends every wait.
//
// A node is its name: a member entry whose name a later entry of the
// round has again is void, the later one taking its place (the join
// round's rule). A node killed while its round was forming leaves its
// entry, and started again at once (a Kubernetes pod keeps its name) it
// joins that round again: its old entry, whose process is gone, must
// neither count towards the round's size nor clash with it. If the old
// entry's process still runs (two live nodes with one name), it finds
// itself replaced and stops, saying so, without ending the job: two
// nodes of one name never both run.

// nodeInfo is what a node says of itself in a round.
type nodeInfo struct {
	Name        string `json:"name"`                 // --local-addr, else the hostname
	Addr        string `json:"addr"`                 // where the other nodes reach it (MASTER_ADDR when it is node 0)
	Nproc       int    `json:"nproc"`                // its ranks
	Rank        int    `json:"rank"`                 // --node-rank; -1 for auto
	Port        int    `json:"port"`                 // a port it found free: MASTER_PORT when it is node 0
	MaxRestarts int    `json:"max_restarts"`         // must agree job-wide
	StoreHost   bool   `json:"store_host,omitempty"` // it hosts the c10d store
	Job         string `json:"job,omitempty"`        // Workload.Digest: must agree job-wide
	// Plan is the state Runtime.Plan returned for attempt PlanAttempt, the
	// last this node planned (World.State): the newest in a round is the
	// one every node plans the next attempt from.
	Plan        string `json:"plan,omitempty"`
	PlanAttempt int    `json:"plan_attempt,omitempty"`
}

// lastCall is how long a round that reached MIN nodes waits for more
// before it closes (torchrun's last_call_timeout).
var lastCall = 30 * time.Second

func roundKey(n int, k string) string { return "pernode/" + strconv.Itoa(n) + "/" + k }

// errSpare means the round closed without this node: it waits for the next.
var errSpare = errors.New("the round closed without this node")

// errReplaced means a later entry of this node's name took its place in
// the round: the node leaves without ending the job, which goes on with
// the other.
var errReplaced = errors.New("a later node of the same name took this node's place")

// meetRound joins round n and returns its members in node-rank order and
// this node's rank. It waits at most timeout for MIN nodes.
func (pn *perNode) meetRound(ctx context.Context, n int, me nodeInfo, timeout time.Duration) ([]nodeInfo, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s := pn.store
	i, err := s.Add(ctx, roundKey(n, "count"), 1)
	if err != nil {
		return nil, 0, pn.storeErr(ctx, n, err, timeout)
	}
	raw, _ := json.Marshal(me)
	if err := s.Set(ctx, roundKey(n, "member/"+strconv.FormatInt(i, 10)), raw); err != nil {
		return nil, 0, pn.storeErr(ctx, n, err, timeout)
	}
	r := newRoundEntries(pn, n)
	closed, err := pn.waitClosed(ctx, r, i)
	if err == nil && i <= closed {
		err = r.readTo(ctx, closed)
	}
	if err != nil {
		return nil, 0, pn.storeErr(ctx, n, err, timeout)
	}
	if i > closed {
		return nil, 0, errSpare
	}
	members, mine := r.nodes(closed, i)
	if mine < 0 {
		return nil, 0, fmt.Errorf("launch: round %d at %s: %w (node %s joined again): if that is another node, not this one started again, give each node its own --local-addr",
			n, pn.endpoint, errReplaced, me.Name)
	}
	return assignRanks(members, mine)
}

// roundEntries are the member entries of a round that a node has read:
// read in order and each once, since an entry does not change once
// written.
type roundEntries struct {
	pn      *perNode
	n       int
	entries []nodeInfo      // member/1, member/2, ...
	names   map[string]bool // the names of entries
	nodesAt []int64         // nodesAt[j]: the nodes (names) of the first j+1 entries
}

func newRoundEntries(pn *perNode, n int) *roundEntries {
	return &roundEntries{pn: pn, n: n, names: map[string]bool{}}
}

// readTo reads the entries up to member/k; each exists once its node has
// written it.
func (r *roundEntries) readTo(ctx context.Context, k int64) error {
	for j := int64(len(r.entries)) + 1; j <= k; j++ {
		v, err := r.pn.store.Get(ctx, roundKey(r.n, "member/"+strconv.FormatInt(j, 10)))
		var m nodeInfo
		if err == nil {
			err = json.Unmarshal(v, &m)
		}
		if err != nil {
			return err
		}
		r.entries = append(r.entries, m)
		r.names[m.Name] = true
		r.nodesAt = append(r.nodesAt, int64(len(r.names)))
	}
	return nil
}

// fullAt is the fewest of the first k entries that are nodes nodes (by
// name), or 0 when all k are fewer. It reads no further than it must: a
// spare, joined after the round filled, reads the round's entries only.
func (r *roundEntries) fullAt(ctx context.Context, k int64, nodes int) (int64, error) {
	if k < int64(nodes) {
		return 0, nil
	}
	for j := int64(nodes); j <= k; j++ {
		if err := r.readTo(ctx, j); err != nil {
			return 0, err
		}
		if r.nodesAt[j-1] >= int64(nodes) {
			return j, nil
		}
	}
	return 0, nil
}

// nodes are the members of the round closed at its first k entries, in
// the order they joined, each name by its newest entry, and the index
// among them of entry i (-1: a later entry of its name replaced it).
func (r *roundEntries) nodes(k, i int64) ([]nodeInfo, int) {
	newest := map[string]int64{}
	for j, m := range r.entries[:k] {
		newest[m.Name] = int64(j) + 1
	}
	var out []nodeInfo
	mine := -1
	for j, m := range r.entries[:k] {
		if newest[m.Name] != int64(j)+1 {
			continue
		}
		if int64(j)+1 == i {
			mine = len(out)
		}
		out = append(out, m)
	}
	return out, mine
}

// waitClosed waits until round n closes and returns its size in entries.
// Node i (1-based) learns of every later join through member/(i+1), ...
// The round counts its nodes by name (roundEntries).
func (pn *perNode) waitClosed(ctx context.Context, r *roundEntries, i int64) (int64, error) {
	known := i
	var last <-chan time.Time
	for {
		full, err := r.fullAt(ctx, known, pn.max)
		if err != nil {
			return 0, err
		}
		if full > 0 {
			return pn.closeRound(ctx, r.n, full)
		}
		if last == nil {
			enough, err := r.fullAt(ctx, known, pn.min)
			if err != nil {
				return 0, err
			}
			if enough > 0 {
				last = time.After(lastCall)
			}
		}
		next, err := pn.waitNext(ctx, r.n, known+1, last)
		switch {
		case err != nil:
			return 0, err
		case next == 0: // the last call is over
			return pn.closeRound(ctx, r.n, known)
		case next < 0: // closed by another node
			return pn.closedSize(ctx, r.n)
		}
		known = next
	}
}

// waitNext waits for the k-th member of round n (returning k), the round's
// close (-1), the last call (0), or the job's end (an error).
func (pn *perNode) waitNext(ctx context.Context, n int, k int64, last <-chan time.Time) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan int64, 3)
	errs := make(chan error, 3)
	wait := func(key string, v int64) {
		if _, err := pn.store.Get(wctx, key); err != nil {
			errs <- err
			return
		}
		got <- v
	}
	go wait(roundKey(n, "member/"+strconv.FormatInt(k, 10)), k)
	go wait(roundKey(n, "closed"), -1)
	go wait(pn.endKey(), -2)
	select {
	case v := <-got:
		if v == -2 {
			return 0, pn.ended(ctx)
		}
		return v, nil
	case err := <-errs:
		return 0, err
	case <-last:
		return 0, nil
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
}

// closeRound closes round n at size k unless another node closed it first, and
// returns the size it closed at.
func (pn *perNode) closeRound(ctx context.Context, n int, k int64) (int64, error) {
	_, cur, err := pn.store.CompareAndSet(ctx, roundKey(n, "closed"), nil, []byte(strconv.FormatInt(k, 10)))
	if err != nil {
		return 0, err
	}
	return parseSize(cur)
}

func (pn *perNode) closedSize(ctx context.Context, n int) (int64, error) {
	v, err := pn.store.Get(ctx, roundKey(n, "closed"))
	if err != nil {
		return 0, err
	}
	return parseSize(v)
}

func parseSize(v []byte) (int64, error) {
	k, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || k < 1 {
		return 0, fmt.Errorf("malformed round size %q in the store", v)
	}
	return k, nil
}

// assignRanks orders a closed round's members (in joining order; mine is
// the index of this node) by node rank: given ranks where given, then the
// others in the order of their names (torchrun's c10d sorts its nodes
// too, so that a restart keeps every node's rank). Every node computes the
// same order from the same members.
func assignRanks(members []nodeInfo, mine int) ([]nodeInfo, int, error) {
	out := make([]nodeInfo, len(members))
	taken := make([]bool, len(members))
	names := map[string]bool{}
	var auto []int
	for j, m := range members {
		if names[m.Name] {
			return nil, 0, fmt.Errorf("launch: two nodes named %s joined the job: give each its own --local-addr", m.Name)
		}
		names[m.Name] = true
		if m.Job != members[0].Job {
			return nil, 0, fmt.Errorf("launch: node %s runs another job than node %s (job digest %s, not %s): start every node with the same --job, --set and working directory",
				m.Name, members[0].Name, digestOrNone(m.Job), digestOrNone(members[0].Job))
		}
		if m.MaxRestarts != members[0].MaxRestarts {
			return nil, 0, fmt.Errorf("launch: node %s has --max-restarts %d, node %s %d: start every node with the same flags",
				m.Name, m.MaxRestarts, members[0].Name, members[0].MaxRestarts)
		}
		switch {
		case m.Rank < 0:
			auto = append(auto, j)
		case m.Rank >= len(members):
			return nil, 0, fmt.Errorf("launch: node %s has --node-rank %d, but the job has %d nodes (ranks 0 to %d)", m.Name, m.Rank, len(members), len(members)-1)
		case taken[m.Rank]:
			return nil, 0, fmt.Errorf("launch: node %s and node %s both have --node-rank %d: give each node its own", out[m.Rank].Name, m.Name, m.Rank)
		default:
			taken[m.Rank] = true
			out[m.Rank] = m
		}
	}
	slices.SortFunc(auto, func(x, y int) int { return cmp.Compare(members[x].Name, members[y].Name) })
	free := 0
	myRank := -1
	for _, j := range auto {
		for taken[free] {
			free++
		}
		taken[free] = true
		out[free] = members[j]
		if j == mine {
			myRank = free
		}
	}
	if myRank < 0 {
		myRank = members[mine].Rank
	}
	return out, myRank, nil
}

// endKey holds the end of this node's run of the job, once a node leaves
// it for good (jobEnd): under the run's first round (pernode_run.go).
func (pn *perNode) endKey() string { return roundKey(pn.first, "end") }

// jobEnd is the value of endKey.
type jobEnd struct {
	OK     bool   `json:"ok"`
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
}

// ended is the error of a node that finds the job ended without it.
func (pn *perNode) ended(ctx context.Context) error {
	v, err := pn.store.Get(ctx, pn.endKey())
	if err != nil {
		return err
	}
	return endedBy(v)
}

// endedBy is the *jobEndedError of a stored end.
func endedBy(v []byte) error {
	var e jobEnd
	if err := json.Unmarshal(v, &e); err != nil {
		return fmt.Errorf("launch: malformed job end in the store: %w", err)
	}
	return &jobEndedError{e}
}

// jobEndedError is the end of a job this node found over (a spare, or a
// node started again with the same --rdzv-id).
type jobEndedError struct{ end jobEnd }

func (e *jobEndedError) Error() string {
	if e.end.OK {
		return fmt.Sprintf("launch: the job (--rdzv-id) ended already: it finished on the other nodes (node %s said so); choose another --rdzv-id for a new job", e.end.By)
	}
	return fmt.Sprintf("launch: the job (--rdzv-id) ended already: node %s stopped it: %s", e.end.By, e.end.Reason)
}

// storeErr is a failed store request of round n, naming the rendezvous: a
// stop (a signal) as its cause, whichever request it interrupted; a store
// refusing this node's secret, or a round that did not fill in time, with
// what to do; the job's end elsewhere as it is.
func (pn *perNode) storeErr(ctx context.Context, n int, err error, timeout time.Duration) error {
	var je *jobEndedError
	if errors.As(err, &je) {
		return err
	}
	if errors.Is(err, rendezvous.ErrAuth) {
		return fmt.Errorf("launch: round %d at %s: %w (every node must have the same --rdzv-secret-file or GTRAIN_RDZV_SECRET)", n, pn.endpoint, err)
	}
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		if errors.Is(cause, context.DeadlineExceeded) {
			return fmt.Errorf("launch: round %d at %s: not enough nodes joined within %v (--nnodes %d:%d): start gtrain run on every node with the same --rdzv-id, or raise --join-timeout", n, pn.endpoint, timeout, pn.min, pn.max)
		}
		return fmt.Errorf("launch: round %d at %s: %w", n, pn.endpoint, cause)
	}
	return fmt.Errorf("launch: round %d at %s: %w", n, pn.endpoint, err)
}

// digestOrNone names a node's job digest; a command's job has none.
func digestOrNone(d string) string {
	if d == "" {
		return "none: a command"
	}
	return d
}

// plannedState carries Runtime.Plan's state through a per-node job's
// rounds: every node plans its own ranks, from the newest state any
// member of the round has, so that a node that joined at a restart plans
// as the others do.
type plannedState struct {
	mu    sync.Mutex
	state string // what this attempt's plan returned
	done  bool
}

// wrap is plan given the newest state of the round's members; nil when
// the job has no plan.
func (ps *plannedState) wrap(plan func(context.Context, World) (Planned, error), members []nodeInfo) func(context.Context, World) (Planned, error) {
	if plan == nil {
		return nil
	}
	newest := slices.MaxFunc(members, func(a, b nodeInfo) int {
		return cmp.Or(cmp.Compare(a.PlanAttempt, b.PlanAttempt), cmp.Compare(min(len(a.Plan), 1), min(len(b.Plan), 1)))
	})
	return func(ctx context.Context, w World) (Planned, error) {
		w.State = newest.Plan
		pl, err := plan(ctx, w)
		if err == nil {
			ps.mu.Lock()
			ps.state, ps.done = pl.State, true
			ps.mu.Unlock()
		}
		return pl, err
	}
}

// after is this node's state for the next round once attempt n is over:
// the plan's for attempt n where it ran, else the one it had (state of
// attempt last).
func (ps *plannedState) after(state string, last, n int) (string, int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.done || ps.state == "" {
		return state, last
	}
	return ps.state, n
}
