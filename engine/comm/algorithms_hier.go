package comm

import (
	"context"
	"errors"
	"fmt"
)

// The hierarchical collectives, for groups that span hosts with more than
// one rank on some host: all-reduce, reduce-scatter and all-gather run in
// two levels, within each host (shared memory, the direct algorithms) and
// across the hosts (TCP), so that each byte crosses the network once per
// host instead of once per rank, the network sees rings of one rank per
// host, and everything else stays in shared memory.
//
// Hosts may have different numbers of ranks (2, 1 and 3, say), in any
// order of ranks. The buffer is cut into m channels, m the fewest ranks
// any host has; the first m ranks of every host own one channel each, and
// the ranks with that index on every host form the channel's across-hosts
// level. All-reduce: reduce-scatter within the host onto the channel
// owners, all-reduce each channel across the hosts, all-gather within the
// host. Reduce-scatter: the buffer is first packed channel by channel, host
// by host (hierLayout), so that the same two steps leave each owner with
// the reduced blocks of the ranks of its channel on its host; a rank
// beyond the first m gets its block from its channel's owner. All-gather
// is the mirror image.
//
// The levels are sub-communicators, split off the group on its first
// large collective of the three: every rank takes that decision at the
// same call, since it depends only on the call's size and the group's
// shape. The hierarchical call itself still sends its header to the next
// rank and checks the previous one's, so mismatched calls are reported as
// in the flat algorithms.

// hierarchy is the two-level view of a group; local == nil means the group
// is not hierarchical (one host, or one rank per host).
type hierarchy struct {
	local *Communicator // the ranks on this host
	cross *Communicator // this rank's channel on every host; nil beyond the first m ranks of its host
	hosts [][]int       // each host's ranks, ascending; hosts in order of their lowest rank
	host  int           // this rank's host, an index into hosts
	index int           // this rank's index among its host's ranks (its local rank)
	m     int           // channels: the fewest ranks any host has
}

// hierarchicalFor returns the two levels to run a collective of nbytes
// on, or nil for the flat algorithms, setting them up on first use. Only
// the public collectives (Block's rule, q a partition) go hierarchical.
// It runs as part of the executing operation.
func (c *Communicator) hierarchicalFor(ctx context.Context, q blocks, verr error, nbytes int) (*hierarchy, error) {
	if _, public := q.(partition); !public || verr != nil || c.usable() != nil {
		return nil, nil
	}
	return c.hierarchical(ctx, nbytes)
}

func (c *Communicator) hierarchical(ctx context.Context, nbytes int) (*hierarchy, error) {
	if c.alg != algAuto || c.shm != nil || nbytes < c.opts.RingThreshold || c.size < 3 {
		return nil, nil
	}
	if c.hier == nil {
		h, err := c.setupHierarchy(ctx)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.hier = h
		closed := c.connsClosed
		c.mu.Unlock()
		if closed { // Close ran during the setup
			c.closeHierarchy()
		}
	}
	if c.hier.local == nil {
		return nil, nil
	}
	return c.hier, nil
}

// setupHierarchy learns every rank's host (named by its lowest rank, from
// the links each rank has) and, when the group spans hosts with more than
// one rank on some host, splits it into the two levels.
func (c *Communicator) setupHierarchy(ctx context.Context) (*hierarchy, error) {
	color := c.rank // the lowest rank on this host, by the links
	for j, cn := range c.conns {
		if j != c.rank && isLocal(cn) {
			color = min(color, j)
		}
	}
	_, canSplit := c.tr.(GroupTransport)
	split := 0
	if canSplit {
		split = 1
	}
	all, err := c.exchangeColors(ctx, color, split)
	if err != nil {
		return nil, err
	}
	hosts, ok := hostsOf(all, c.size)
	if !ok || len(hosts) < 2 || len(hosts) == c.size {
		return &hierarchy{}, nil
	}
	h := &hierarchy{hosts: hosts, m: c.size}
	for k, rs := range hosts {
		h.m = min(h.m, len(rs))
		for i, r := range rs {
			if r == c.rank {
				h.host, h.index = k, i
			}
		}
	}
	name := nameOr(c.opts.Name)
	if h.local, err = c.split(ctx, hosts[h.host][0], c.rank, fmt.Sprintf("%s/host%d", name, hosts[h.host][0])); err != nil {
		return nil, err
	}
	channel := -1 // in no channel
	if h.index < h.m {
		channel = h.index
	}
	if h.cross, err = c.split(ctx, channel, h.host, fmt.Sprintf("%s/across%d", name, channel)); err != nil {
		h.local.Close()
		return nil, err
	}
	if h.cross != nil {
		h.cross.hier = &hierarchy{} // one rank per host: flat
	}
	return h, nil
}

// hostsOf groups the ranks by the host each named (its lowest rank, in
// all[2r], exchanged by setupHierarchy), hosts in order of that rank. ok is
// false when a rank cannot split (all[2r+1] == 0) or the names disagree
// with the links (a host not named by its lowest rank).
func hostsOf(all []int32, p int) (hosts [][]int, ok bool) {
	at := map[int]int{} // lowest rank → index into hosts
	for r := range p {
		color := int(all[2*r])
		if all[2*r+1] == 0 || color < 0 || color > r {
			return nil, false
		}
		k, seen := at[color]
		if !seen {
			if color != r {
				return nil, false
			}
			k = len(hosts)
			at[color] = k
			hosts = append(hosts, nil)
		}
		hosts[k] = append(hosts[k], r)
	}
	return hosts, true
}

func nameOr(s string) string {
	if s == "" {
		return "world"
	}
	return s
}

// channels cuts n elements over this host's ranks: the first m get the
// channels by Block's rule, the rest nothing.
func (h *hierarchy) channels(n int) spans {
	sizes := make([]int, len(h.hosts[h.host]))
	for i := range h.m {
		lo, hi := Block(n, i, h.m)
		sizes[i] = hi - lo
	}
	return spansOf(sizes)
}

// hierHeaders sends this rank's header to the next rank and checks the
// previous one's: a chain of such checks covers the group.
func (o *opState) hierHeaders() error {
	p := o.c.size
	if err := o.sendHeader((o.c.rank + 1) % p); err != nil {
		return err
	}
	return o.recvHeader(o.ctx, (o.c.rank-1+p)%p)
}

// hierAllReduce runs the all-reduce of buf on the two levels.
func (o *opState) hierAllReduce(h *hierarchy, buf Buffer, op Op) error {
	if err := o.hierHeaders(); err != nil {
		return err
	}
	sum := op
	if op == Avg {
		sum = Sum // divide once, by the whole group, at the end
	}
	q := h.channels(buf.Len())
	block := q.block(buf, h.index)
	if err := h.local.reduceScatterSpans(o.ctx, q, buf, block, sum); err != nil {
		return o.levelErr(err)
	}
	if h.cross != nil {
		if err := h.cross.AllReduce(o.ctx, block, sum); err != nil {
			return o.levelErr(err)
		}
		if op == Avg {
			divide(block, o.c.size)
		}
	}
	if err := h.local.allGatherSpans(o.ctx, q, block, buf); err != nil {
		return o.levelErr(err)
	}
	return nil
}

// reduceScatterSpans and allGatherSpans run a level's collective with the
// blocks of q, queued behind the level's other operations as a public
// call is.
func (c *Communicator) reduceScatterSpans(ctx context.Context, q spans, send, recv Buffer, op Op) error {
	return c.do(func() error { return c.reduceScatterIn(ctx, q, send, recv, op) })
}

func (c *Communicator) allGatherSpans(ctx context.Context, q spans, send, recv Buffer) error {
	return c.do(func() error { return c.allGatherIn(ctx, kAllGather, q, send, recv) })
}

// levelErr passes on a level's failure; the caller's cancellation and the
// operation's timeout read as they would in a flat algorithm.
func (o *opState) levelErr(err error) error {
	if cause := context.Cause(o.ctx); cause != nil && !errors.Is(err, ErrAborted) {
		if errors.Is(cause, errOpTimeout) {
			return err // the level names the stuck peer
		}
		return cause
	}
	return err
}

// closeHierarchy closes the levels with the group.
func (c *Communicator) closeHierarchy() {
	c.mu.Lock()
	h := c.hier
	c.mu.Unlock()
	if h == nil || h.local == nil {
		return
	}
	h.local.Close()
	if h.cross != nil {
		h.cross.Close()
	}
}
