package flightrec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Report is Analyze's answer: where the ranks wait, and for whom.
type Report struct {
	World    int
	Missing  []int     // world ranks that wrote no record
	Waits    []Wait    // every call some rank is stuck in, with whom it waits for
	Culprits []Culprit // the ranks the waits lead to: the ones to blame
	// Unreadable names the records the reader could not use, and why (set
	// by the reader: Analyze takes decoded records).
	Unreadable []string
}

// Wait is one call some ranks of a group are in, and the ranks it waits for.
type Wait struct {
	Group   string
	Ranks   []int // the group's world ranks
	Op      string
	Seq     uint64
	P2P     bool
	Waiters []int // world ranks in the call
	For     []int // world ranks they wait for
}

// Culprit is a rank the waits lead to, and why it holds them up.
type Culprit struct {
	Rank int
	Host string
	Why  string
}

// rankView is what one rank's record says of one group.
type rankView struct {
	cur      *Op // the operation it is in (pending, or failed and never left); nil if none
	lastDone *Op
	rank     int // group rank
}

// groupView is one group across the records: its members' views by world rank.
type groupView struct {
	name  string
	ranks []int
	views map[int]rankView
}

// Analyze reads the records of a job of world ranks (hosts, by world rank,
// may be short or nil) and says which calls ranks wait in, for whom, and
// which ranks are to blame: a rank that wrote no record, one that is in
// no operation, one in another call, or the ranks of a wait cycle.
func Analyze(world int, hosts []string, dumps []*Dump) Report {
	rep := Report{World: world}
	byRank := map[int]*Dump{}
	for _, d := range dumps {
		if d != nil && d.Rank < world {
			byRank[d.Rank] = d
		}
	}
	for r := range world {
		if byRank[r] == nil {
			rep.Missing = append(rep.Missing, r)
		}
	}
	groups := collect(byRank)
	edges := map[int][]int{}
	for _, g := range groups {
		for _, w := range g.waits(byRank) {
			rep.Waits = append(rep.Waits, w)
			for _, r := range w.Waiters {
				for _, n := range w.For {
					if n != r { // every rank of a call can be blocked on one of them
						edges[r] = appendNew(edges[r], n)
					}
				}
			}
		}
	}
	rep.Culprits = culprits(edges, byRank, groups, hosts)
	return rep
}

// collect gathers every group named in the records, keyed by name and ranks.
func collect(byRank map[int]*Dump) []*groupView {
	index := map[string]*groupView{}
	var out []*groupView
	for _, r := range sortedKeys(byRank) {
		for _, g := range byRank[r].Groups {
			key := g.Name + "|" + fmt.Sprint(g.Ranks)
			gv := index[key]
			if gv == nil {
				gv = &groupView{name: g.Name, ranks: g.Ranks, views: map[int]rankView{}}
				index[key] = gv
				out = append(out, gv)
			}
			gv.views[r] = viewOf(g)
		}
	}
	return out
}

func viewOf(g Group) rankView {
	v := rankView{rank: g.Rank}
	for i := len(g.Ops) - 1; i >= 0; i-- {
		op := &g.Ops[i]
		if op.State == Done {
			v.lastDone = op
			break
		}
		if v.cur == nil && i == len(g.Ops)-1 {
			v.cur = op
		}
	}
	return v
}

// waits returns the calls the group's ranks are in, each with the ranks it
// waits for.
func (g *groupView) waits(byRank map[int]*Dump) []Wait {
	type callKey struct {
		op  string
		seq uint64
		p2p bool
		to  int
		frm int
	}
	calls := map[callKey]*Wait{}
	var order []callKey
	for _, r := range sortedKeys(g.views) {
		v := g.views[r]
		if v.cur == nil {
			continue
		}
		k := callKey{op: v.cur.Op, seq: v.cur.Seq, p2p: v.cur.P2P}
		if k.p2p {
			k.to, k.frm = r, v.cur.From // one wait per rank: its peers differ
		}
		w := calls[k]
		if w == nil {
			w = &Wait{Group: g.name, Ranks: g.ranks, Op: k.op, Seq: k.seq, P2P: k.p2p}
			calls[k] = w
			order = append(order, k)
		}
		w.Waiters = append(w.Waiters, r)
	}
	var out []Wait
	for _, k := range order {
		w := calls[k]
		if w.P2P {
			w.For = g.p2pPeers(w.Waiters[0])
		} else {
			w.For = g.absent(byRank, w)
		}
		if len(w.For) == 0 {
			w.For = g.waitedOn(w.Waiters)
		}
		out = append(out, *w)
	}
	return out
}

// absent returns the group's ranks that have not reached the collective w:
// no record, not in the group's record, or neither in it nor past it.
func (g *groupView) absent(byRank map[int]*Dump, w *Wait) []int {
	var out []int
	for _, m := range g.ranks {
		if slices.Contains(w.Waiters, m) {
			continue
		}
		v, ok := g.views[m]
		switch {
		case byRank[m] == nil || !ok:
			out = append(out, m)
		case v.cur != nil && !v.cur.P2P && v.cur.Seq > w.Seq:
		case v.cur == nil && v.lastDone != nil && !v.lastDone.P2P && v.lastDone.Seq >= w.Seq:
		default:
			out = append(out, m)
		}
	}
	return out
}

// p2pPeers returns the world rank the point-to-point operation of r waits
// for: the peer it receives from, else the one it sends to.
func (g *groupView) p2pPeers(r int) []int {
	op := g.views[r].cur
	var out []int
	for _, p := range []int{op.From, op.To} {
		if p >= 0 && p < len(g.ranks) && g.ranks[p] != r {
			out = appendNew(out, g.ranks[p])
		}
	}
	if op.Waiting >= 0 && op.Waiting < len(g.ranks) {
		return []int{g.ranks[op.Waiting]} // the one it is blocked on now
	}
	return out
}

// waitedOn returns the world ranks the waiters' operations say they block on.
func (g *groupView) waitedOn(waiters []int) []int {
	var out []int
	for _, r := range waiters {
		if p := g.views[r].cur.Waiting; p >= 0 && p < len(g.ranks) && g.ranks[p] != r {
			out = appendNew(out, g.ranks[p])
		}
	}
	return out
}

// culprits follows the wait edges to the ranks that wait for nobody; if the
// waits only go round, the ranks of the cycle are the culprits.
func culprits(edges map[int][]int, byRank map[int]*Dump, groups []*groupView, hosts []string) []Culprit {
	var roots []int
	seen := map[int]bool{}
	var visit func(r int)
	visit = func(r int) {
		if seen[r] {
			return
		}
		seen[r] = true
		if len(edges[r]) == 0 {
			roots = append(roots, r)
		}
		for _, n := range edges[r] {
			visit(n)
		}
	}
	for _, r := range sortedKeys(edges) {
		for _, n := range edges[r] {
			visit(n)
		}
	}
	slices.Sort(roots)
	var out []Culprit
	for _, r := range roots {
		out = append(out, Culprit{Rank: r, Host: hostOf(r, byRank, hosts), Why: why(r, byRank, groups)})
	}
	if len(out) == 0 && len(edges) > 0 {
		for _, r := range sortedKeys(edges) {
			out = append(out, Culprit{Rank: r, Host: hostOf(r, byRank, hosts),
				Why: "it waits in a cycle of ranks that all wait for each other (a deadlock: calls issued in different orders?)"})
		}
	}
	return out
}

// why says what a rank that waits for nobody is doing.
func why(r int, byRank map[int]*Dump, groups []*groupView) string {
	if byRank[r] == nil {
		return "it wrote no flight record: it is stopped, dead, or too busy to answer the dump signal"
	}
	for _, g := range groups {
		if v, ok := g.views[r]; ok && v.cur != nil {
			return fmt.Sprintf("it is in %s #%d of group %s (ranks %s), which waits for no rank in particular: the call itself is slow or stuck",
				v.cur.Op, v.cur.Seq, g.name, Ranges(g.ranks))
		}
	}
	var last *Op
	var lastGroup string
	for _, g := range groups {
		v, ok := g.views[r]
		if ok && v.lastDone != nil && (last == nil || v.lastDone.End.After(last.End)) {
			last, lastGroup = v.lastDone, g.name
		}
	}
	if last == nil {
		return "it has completed no operation and has none pending: it is not in a collective (stuck before the first one?)"
	}
	return fmt.Sprintf("its last completed op is %s #%d of group %s; it has no pending op: it is not in a collective (stuck in compute?)",
		last.Op, last.Seq, lastGroup)
}

func hostOf(r int, byRank map[int]*Dump, hosts []string) string {
	if d := byRank[r]; d != nil && d.Host != "" {
		return d.Host
	}
	if r < len(hosts) {
		return hosts[r]
	}
	return ""
}

// String writes the report as the block the launcher prints.
func (rep Report) String() string {
	var sb strings.Builder
	const maxWaits = 16
	for i, w := range rep.Waits {
		if i == maxWaits {
			fmt.Fprintf(&sb, "… and %d more waits\n", len(rep.Waits)-maxWaits)
			break
		}
		verb := " waits"
		if len(w.Waiters) > 1 {
			verb = " wait"
		}
		fmt.Fprintf(&sb, "%s%s in %s #%d of group %s (ranks %s) for %s\n",
			plural(w.Waiters), verb, w.Op, w.Seq, w.Group, Ranges(w.Ranks), plural(w.For))
	}
	for _, c := range rep.Culprits {
		fmt.Fprintf(&sb, "rank %d", c.Rank)
		if c.Host != "" {
			fmt.Fprintf(&sb, " (host %s)", c.Host)
		}
		fmt.Fprintf(&sb, ": %s\n", c.Why)
	}
	if len(rep.Waits) == 0 {
		sb.WriteString("no rank is waiting in an operation\n")
	}
	if len(rep.Missing) > 0 {
		fmt.Fprintf(&sb, "no flight record from %s\n", plural(rep.Missing))
	}
	for _, u := range rep.Unreadable {
		fmt.Fprintf(&sb, "unreadable flight record %s\n", u)
	}
	return sb.String()
}

func plural(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	if len(ranks) == 0 {
		return "no rank"
	}
	return "ranks " + Ranges(ranks)
}

// Ranges formats sorted ranks compactly: "0-3", "0,2,5-7".
func Ranges(ranks []int) string {
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		switch {
		case j-i >= 2:
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		case j > i:
			parts = append(parts, strconv.Itoa(ranks[i]), strconv.Itoa(ranks[j]))
		default:
			parts = append(parts, strconv.Itoa(ranks[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func appendNew(s []int, vs ...int) []int {
	for _, v := range vs {
		if !slices.Contains(s, v) {
			s = append(s, v)
		}
	}
	return s
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
