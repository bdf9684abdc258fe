package comm

import (
	"context"
	"errors"
	"fmt"
)

// The hierarchical all-reduce, for groups that span hosts with the same
// number of ranks on each (more than one): reduce-scatter within each host
// (shared memory, the direct algorithm), all-reduce each block across the
// hosts among the ranks that hold it (the ring, over TCP), all-gather
// within each host. Each byte crosses the network once per host instead
// of once per rank, the ring over the network has one rank per host, and
// everything else stays in shared memory.
//
// The two levels are sub-communicators, split off the group on its first
// large all-reduce: every rank takes that decision at the same call, since
// it depends only on the call's size and the group's shape, which a small
// all-reduce establishes first. The hierarchical call itself still sends
// its header to the next rank and checks the previous one's, so mismatched
// calls are reported as in the flat algorithms.

// hierarchy is the two-level view of a group; the zero value means the
// group is not hierarchical (one host, one rank per host, or hosts with
// different numbers of ranks).
type hierarchy struct {
	local *Communicator // the ranks on this host
	cross *Communicator // the ranks with this rank's index on every host
}

// hierarchical returns the two levels to run an all-reduce of nbytes on,
// or nil for the flat algorithms, setting them up on first use. It runs
// as part of the executing operation.
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

// setupHierarchy learns whether every host has the same number (> 1) of
// this group's ranks, and if so splits the group into the two levels.
func (c *Communicator) setupHierarchy(ctx context.Context) (*hierarchy, error) {
	mine := []int{c.rank} // this rank and the peers its links say share its host
	for j, cn := range c.conns {
		if isLocal(cn) && j != c.rank {
			mine = append(mine, j)
		}
	}
	_, canSplit := c.tr.(GroupTransport)
	n := float32(len(mine))
	agree := []float32{n, -n, 0} // max L, -min L, -min(can split)
	if !canSplit {
		agree[2] = -1
	}
	cl := call{name: "all_reduce (hierarchy setup)", kind: kAllReduce, dt: Float32, op: Max, count: 3, nbytes: 12}
	err := c.collective(ctx, cl, nil, func(o *opState) error { return o.rdAllReduce(F32(agree), Max) })
	if err != nil {
		return nil, err
	}
	if agree[0] != -agree[1] || agree[0] < 2 || int(agree[0]) >= c.size || agree[2] != 0 {
		return &hierarchy{}, nil
	}
	color := c.rank
	for _, j := range mine {
		color = min(color, j)
	}
	local, err := c.split(ctx, color, c.rank, fmt.Sprintf("%s/host%d", nameOr(c.opts.Name), color))
	if err != nil {
		return nil, err
	}
	cross, err := c.split(ctx, local.Rank(), c.rank, fmt.Sprintf("%s/across%d", nameOr(c.opts.Name), local.Rank()))
	if err != nil {
		local.Close()
		return nil, err
	}
	cross.hier = &hierarchy{} // one rank per host: flat
	return &hierarchy{local: local, cross: cross}, nil
}

func nameOr(s string) string {
	if s == "" {
		return "world"
	}
	return s
}

// hierAllReduce runs the all-reduce of buf on the two levels.
func (o *opState) hierAllReduce(h *hierarchy, buf Buffer, op Op) error {
	p := o.c.size
	// Mismatch detection: our header to the next rank, the previous one's
	// checked (a chain of such checks covers the group).
	next, prev := (o.c.rank+1)%p, (o.c.rank-1+p)%p
	if err := o.sendHeader(next); err != nil {
		return err
	}
	if err := o.recvHeader(o.ctx, prev); err != nil {
		return err
	}
	sum := op
	if op == Avg {
		sum = Sum // divide once, by the whole group, at the end
	}
	q := partition{buf.Len(), h.local.Size()}
	block := q.block(buf, h.local.Rank())
	if err := h.local.ReduceScatter(o.ctx, buf, block, sum); err != nil {
		return o.levelErr(err)
	}
	if err := h.cross.AllReduce(o.ctx, block, sum); err != nil {
		return o.levelErr(err)
	}
	if op == Avg {
		divide(block, p)
	}
	if err := h.local.AllGather(o.ctx, block, buf); err != nil {
		return o.levelErr(err)
	}
	return nil
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
	if h != nil && h.local != nil {
		h.local.Close()
		h.cross.Close()
	}
}
