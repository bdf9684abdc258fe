package comm

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
)

// GroupTransport is a Transport that can open more than one independent
// link to the same peer, one per named group. Split needs it: a sub-group's
// traffic must not interleave with its parent's (or a sibling's) on one
// Conn, since the groups run concurrently. InProc implements it; the TCP
// and shared-memory transports should too.
type GroupTransport interface {
	Transport
	// ConnectGroup is Connect for the link to peer that belongs to group: a
	// link distinct from Connect's and from other groups'. Both ends call it
	// with the same group name, which the caller makes unique per group.
	ConnectGroup(ctx context.Context, peer int, group string) (Conn, error)
}

// Split partitions the group, with MPI_Comm_split's semantics: the ranks
// that pass the same color form a new communicator, ordered by key, ties
// broken by rank in this communicator. A negative color means "in no new
// group": that rank gets nil. Every rank must call Split (it is a
// collective). The new communicator inherits the options, with Name
// "<name>/<color>" and Hosts mapped to its ranks, and opens its own links
// (see GroupTransport), so it can run concurrently with this one.
func (c *Communicator) Split(ctx context.Context, color, key int) (*Communicator, error) {
	return c.SplitNamed(ctx, "", color, key)
}

// SplitNamed is Split with the new communicator's Name ("tp", "dp", …), so
// that its errors and flight record say which group it is: groups of
// different kinds that start at the same rank otherwise read alike. An
// empty name is Split's "<name>/<color>".
func (c *Communicator) SplitNamed(ctx context.Context, name string, color, key int) (*Communicator, error) {
	var child *Communicator
	err := c.do(func() error {
		var err error
		child, err = c.split(ctx, color, key, name)
		return err
	})
	return child, err
}

func (c *Communicator) split(ctx context.Context, color, key int, name string) (*Communicator, error) {
	seq := c.seq
	all, err := c.exchangeColors(ctx, color, key)
	if err != nil {
		return nil, err
	}
	if color < 0 {
		return nil, nil
	}
	wrap := func(err error) error {
		return &OpError{Comm: c.opts.Name, Rank: c.rank, Op: "split", Seq: int64(seq), Err: err}
	}
	gt, ok := c.tr.(GroupTransport)
	if !ok { // after the exchange, so every rank fails here alike
		return nil, wrap(fmt.Errorf("transport %T cannot open links for a sub-group (it does not implement GroupTransport)", c.tr))
	}
	var members []int
	for r := range c.size {
		if all[2*r] == int32(color) {
			members = append(members, r)
		}
	}
	slices.SortStableFunc(members, func(a, b int) int { return cmp.Compare(all[2*a+1], all[2*b+1]) })
	opts := c.childOptions(color, members)
	if name != "" {
		opts.Name = name
	}
	child, err := newComm(ctx, slices.Index(members, c.rank), len(members), &groupView{
		gt: gt, tag: fmt.Sprintf("%s/%d/%d", c.tag, seq, color), members: members,
	}, opts)
	if err != nil {
		return nil, err
	}
	child.tag = fmt.Sprintf("%s/%d/%d", c.tag, seq, color)
	child.world = make([]int, len(members))
	for i, m := range members {
		child.world[i] = c.WorldRank(m)
	}
	child.register()
	return child, nil
}

// exchangeColors all-gathers every rank's (color, key), as int32 bits in a
// float32 buffer (all-gather moves bits exactly).
func (c *Communicator) exchangeColors(ctx context.Context, color, key int) ([]int32, error) {
	mine := make([]float32, 2)
	all := make([]float32, 2*c.size)
	var verr error
	if color < math.MinInt32 || color > math.MaxInt32 || key < math.MinInt32 || key > math.MaxInt32 {
		verr = fmt.Errorf("color %d or key %d out of int32 range", color, key)
	}
	mine[0] = math.Float32frombits(uint32(int32(color)))
	mine[1] = math.Float32frombits(uint32(int32(key)))
	q := partition{len(all), c.size}
	cl := call{kind: kSplit, dt: Float32, count: len(all), nbytes: 4 * len(all)}
	err := c.collective(ctx, cl, verr, func(o *opState) error {
		copy(q.block(F32(all), c.rank).f32(), mine)
		if c.size == 1 {
			return nil
		}
		if o.alg == algRing {
			return o.ringAllGather(q, F32(all), Buffer{})
		}
		return o.allReduceSmall(o.alg, F32(all), opBor)
	})
	out := make([]int32, len(all))
	for i, f := range all {
		out[i] = int32(math.Float32bits(f))
	}
	return out, err
}

func (c *Communicator) childOptions(color int, members []int) Options {
	opts := c.opts
	name := c.opts.Name
	if name == "" {
		name = "world"
	}
	opts.Name = fmt.Sprintf("%s/%d", name, color)
	opts.Hosts = nil
	if len(c.opts.Hosts) > 0 {
		opts.Hosts = make([]string, len(members))
		for i, m := range members {
			if m < len(c.opts.Hosts) {
				opts.Hosts[i] = c.opts.Hosts[m]
			}
		}
	}
	opts.Algorithm = c.alg.String()
	return opts
}

// groupView is the Transport of a sub-group: its peers are group ranks,
// mapped to the parent's, and its links are the parent's group links.
type groupView struct {
	gt      GroupTransport
	tag     string
	members []int // group rank → parent rank
}

// Connect opens the group's link to its rank peer.
func (g *groupView) Connect(ctx context.Context, peer int) (Conn, error) {
	return g.gt.ConnectGroup(ctx, g.members[peer], g.tag)
}

// ConnectGroup opens a nested group's link to its rank peer (group names
// already carry the whole path).
func (g *groupView) ConnectGroup(ctx context.Context, peer int, group string) (Conn, error) {
	return g.gt.ConnectGroup(ctx, g.members[peer], group)
}

// Close does nothing: the links belong to the communicators, the transport
// to the world's owner.
func (g *groupView) Close() error { return nil }
