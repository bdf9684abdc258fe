package comm

// Hierarchical reduce-scatter and all-gather (see algorithms_hier.go).
// Rank r's block (Block's rule over the group) must end on rank r, but the
// levels cut a buffer by channel and host: so the buffer is packed into
// the levels' order first (reduce-scatter) or unpacked from it last
// (all-gather). A memory copy of the buffer costs far less than what the
// two levels save on the network.

// hierLayout is the packed order of a group's blocks: channel by channel,
// within a channel host by host, within a host the channel's ranks by
// index (the owner first). So each channel is one contiguous segment (the
// local level's block of its owner), and within it each host's part is
// contiguous (the across level's block of that host).
type hierLayout struct {
	at    []int // at[r]: where rank r's block starts in the packed buffer
	local spans // the packed buffer over this host's ranks: the channels, then nothing
	cross spans // this rank's channel over the hosts
}

// layout places the blocks of w.
func (h *hierarchy) layout(w partition) hierLayout {
	l := hierLayout{at: make([]int, w.p)}
	seg := make([]int, len(h.hosts[h.host]))
	cross := make([]int, len(h.hosts))
	off := 0
	for c := range h.m {
		for k, rs := range h.hosts {
			for i := c; i < len(rs); i += h.m {
				n := w.count(rs[i])
				l.at[rs[i]] = off
				off += n
				seg[c] += n
				if c == h.index%h.m {
					cross[k] += n
				}
			}
		}
	}
	l.local, l.cross = spansOf(seg), spansOf(cross)
	return l
}

// hierReduceScatter leaves block r of the reduction of send in recv:
// packed, reduce-scattered within the host onto the channel owners, then
// across the hosts; an owner sends the other ranks of its channel their
// blocks.
func (o *opState) hierReduceScatter(h *hierarchy, send, recv Buffer, op Op) error {
	if err := o.hierHeaders(); err != nil {
		return err
	}
	sum := op
	if op == Avg {
		sum = Sum // divide once, by the whole group, at the end
	}
	w := partition{send.Len(), o.c.size}
	l := h.layout(w)
	packed := o.scratch(slotCopy, send.dt, send.Len())
	for r, at := range l.at {
		copy(packed.Slice(at, at+w.count(r)).b, w.block(send, r).b)
	}
	seg := l.local.block(packed, h.index)
	if err := h.local.reduceScatterSpans(o.ctx, l.local, packed, seg, sum); err != nil {
		return o.levelErr(err)
	}
	if h.cross == nil { // beyond the channels: the owner sends the block
		if err := h.local.Recv(o.ctx, recv, h.index%h.m); err != nil {
			return o.levelErr(err)
		}
		return nil
	}
	rs := h.hosts[h.host]
	out := recv
	if h.index+h.m < len(rs) { // blocks of other ranks come too
		out = o.scratch(slotWork, send.dt, l.cross.count(h.host))
	}
	if err := h.cross.reduceScatterSpans(o.ctx, l.cross, seg, out, sum); err != nil {
		return o.levelErr(err)
	}
	if op == Avg {
		divide(out, o.c.size)
	}
	copyInto(recv, out.Slice(0, recv.Len()))
	off := recv.Len()
	for i := h.index + h.m; i < len(rs); i += h.m {
		n := w.count(rs[i])
		if err := h.local.Send(o.ctx, out.Slice(off, off+n), i); err != nil {
			return o.levelErr(err)
		}
		off += n
	}
	return nil
}

// hierAllGather fills recv with every rank's block: the blocks of a
// channel's ranks meet at its owner, are all-gathered across the hosts,
// then within the host, and unpacked.
func (o *opState) hierAllGather(h *hierarchy, send, recv Buffer) error {
	if err := o.hierHeaders(); err != nil {
		return err
	}
	w := partition{recv.Len(), o.c.size}
	l := h.layout(w)
	packed := o.scratch(slotCopy, recv.dt, recv.Len())
	seg := l.local.block(packed, h.index)
	if h.cross == nil {
		if err := h.local.Send(o.ctx, send, h.index%h.m); err != nil {
			return o.levelErr(err)
		}
	} else {
		mine := l.cross.block(seg, h.host)
		copy(mine.b, send.b)
		rs, off := h.hosts[h.host], send.Len()
		for i := h.index + h.m; i < len(rs); i += h.m {
			n := w.count(rs[i])
			if err := h.local.Recv(o.ctx, mine.Slice(off, off+n), i); err != nil {
				return o.levelErr(err)
			}
			off += n
		}
		if err := h.cross.allGatherSpans(o.ctx, l.cross, mine, seg); err != nil {
			return o.levelErr(err)
		}
	}
	if err := h.local.allGatherSpans(o.ctx, l.local, seg, packed); err != nil {
		return o.levelErr(err)
	}
	for r, at := range l.at {
		copy(w.block(recv, r).b, packed.Slice(at, at+w.count(r)).b)
	}
	return nil
}
