package comm

import (
	"fmt"
	"math/bits"
)

// Algorithms, and which one each collective uses. "auto" picks by the size
// of the whole buffer (the all-reduce buffer, the reduce-scatter input, the
// all-gather output): below Options.RingThreshold (64 KiB by default) the
// latency-optimal one, from it on the bandwidth-optimal ring, or direct
// (algorithms_direct.go: every rank with every other, streamed through the
// shared-memory rings) when all ranks share one host. A group that spans
// hosts, with more than one rank on some host (equal numbers or not),
// all-reduces, reduce-scatters and all-gathers hierarchically from the
// threshold on (algorithms_hier.go). Forcing direct on a group that spans
// hosts gets the ring.
//
//	collective      small (auto)  ring                          rd                          tree                         direct
//	all_reduce      rd            reduce-scatter + all-gather   recursive doubling          binomial reduce + broadcast  both phases, streamed
//	reduce_scatter  rd            ring                          rd all-reduce, keep a block tree all-reduce, keep a block  each rank reduces its block, streamed
//	all_gather      rd            ring                          rd all-reduce of bitwise OR tree all-reduce of OR         every block to every rank, streamed
//	broadcast       tree          pipelined chain               = tree                      binomial tree                = tree
//	reduce          tree          ring reduce-scatter + gather  = tree                      binomial tree                = tree
//	gather/scatter  the root talks to every rank at once; Algorithm is ignored
//	barrier         rd over headers only
//
// For an n-byte buffer, p ranks, latency α and time per byte β: ring costs
// 2(p-1)α + 2(p-1)/p·nβ, rd ⌈log2 p⌉(α + nβ) (two steps more when p is not
// a power of two), tree 2⌈log2 p⌉(α + nβ). The ring is pipelined in chunks
// of Options.ChunkBytes, with one goroutine sending and one receiving, so a
// step's receive and reduction overlap the next send; over TCP one
// goroutine drives both sockets without blocking (algorithms_ring_tcp.go),
// as it drives each exchange of rd (algorithms_rd_tcp.go).

type algorithm uint8

const (
	algAuto algorithm = iota
	algRing
	algRD
	algTree
	algDirect
	algHier // hierarchical (algorithms_hier.go)
)

func (a algorithm) String() string {
	switch a {
	case algAuto:
		return "auto"
	case algRing:
		return "ring"
	case algRD:
		return "rd"
	case algTree:
		return "tree"
	case algDirect:
		return "direct"
	case algHier:
		return "hierarchical"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

func parseAlgorithm(s string) (algorithm, error) {
	switch s {
	case "", "auto":
		return algAuto, nil
	case "ring":
		return algRing, nil
	case "rd":
		return algRD, nil
	case "tree":
		return algTree, nil
	case "direct":
		return algDirect, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want auto, ring, rd, tree or direct)", s)
}

// pick chooses the algorithm for a collective whose buffer is nbytes long.
func (c *Communicator) pick(kind opKind, nbytes int) algorithm {
	switch kind {
	case kGather, kScatter, kSend:
		return algDirect
	case kBarrier:
		return algRD
	}
	a := c.alg
	if a == algAuto {
		a = algRD
		if nbytes >= c.opts.RingThreshold {
			a = algRing
			if c.shm != nil && (kind == kAllReduce || kind == kReduceScatter || kind == kAllGather) {
				a = algDirect
			}
		}
	}
	if a == algDirect && c.shm == nil {
		a = algRing // direct needs every peer on this host
	}
	if (a == algRD || a == algDirect) && (kind == kBroadcast || kind == kReduce) {
		a = algTree
	}
	return a
}

// Block is the range [lo, hi) of n elements that rank owns when they are
// split over size ranks, MPI-style: n/size each, one more for the first
// n%size ranks, in rank order; no divisibility is required. It is the rule
// of ReduceScatter (block r stays on rank r) and AllGather (which collects
// the blocks), and so of everything split to meet them: ZeRO partitions,
// tensor-parallel shards.
func Block(n, rank, size int) (lo, hi int) {
	lo = rank*(n/size) + min(rank, n%size)
	hi = lo + n/size
	if rank < n%size {
		hi++
	}
	return lo, hi
}

// blocks is how a collective's buffer is cut into one block per rank:
// partition (Block's rule) for every public collective, spans for the
// levels of the hierarchical ones, whose blocks follow the hosts.
type blocks interface {
	count(i int) int
	offset(i int) int
	block(b Buffer, i int) Buffer
}

// partition splits n elements into p blocks by Block's rule.
type partition struct{ n, p int }

func (q partition) count(i int) int {
	lo, hi := Block(q.n, i, q.p)
	return hi - lo
}

func (q partition) offset(i int) int {
	lo, _ := Block(q.n, i, q.p)
	return lo
}

func (q partition) block(b Buffer, i int) Buffer {
	off := q.offset(i)
	return b.Slice(off, off+q.count(i))
}

// spans cuts a buffer into blocks of given sizes: block i is elements
// [s[i], s[i+1]); blocks may be empty.
type spans []int

func (s spans) count(i int) int              { return s[i+1] - s[i] }
func (s spans) offset(i int) int             { return s[i] }
func (s spans) block(b Buffer, i int) Buffer { return b.Slice(s[i], s[i+1]) }

// spansOf returns the spans of blocks of the given sizes, in order.
func spansOf(sizes []int) spans {
	s := make(spans, len(sizes)+1)
	for i, n := range sizes {
		s[i+1] = s[i] + n
	}
	return s
}

func mod(a, p int) int { return ((a % p) + p) % p }

// rdAllReduce is recursive doubling: log2 p exchanges of the whole buffer
// with partners at distance 1, 2, 4, ... For a p that is not a power of two,
// the first 2·rem ranks (rem = p - 2^⌊log2 p⌋) fold in first: each even one
// sends its data to the next odd one and waits for the result, which the
// odd one sends back at the end. Both partners of an exchange combine
// lower-group ⊕ higher-group, so every rank computes the same expression
// and gets bitwise the same result.
func (o *opState) rdAllReduce(buf Buffer, op Op) error {
	p, r := o.c.size, o.c.rank
	pof2 := 1 << (bits.Len(uint(p)) - 1)
	rem := p - pof2
	tmp := o.scratch(slotTmp, buf.dt, buf.Len())
	nr := r - rem // rank among the pof2 that take part in the doubling
	if r < 2*rem {
		if r%2 == 0 {
			if err := o.send(o.ctx, r+1, buf); err != nil {
				return err
			}
			return o.recv(o.ctx, r+1, buf)
		}
		if err := o.recv(o.ctx, r-1, tmp); err != nil {
			return err
		}
		reduceInto(op, buf, tmp, buf)
		nr = r / 2
	}
	for mask := 1; mask < pof2; mask <<= 1 {
		pn := nr ^ mask
		peer := pn + rem
		if pn < rem {
			peer = 2*pn + 1
		}
		if err := o.exchangeReduce(peer, buf, tmp, op, nr < pn); err != nil {
			return err
		}
	}
	if op == Avg {
		divide(buf, p)
	}
	if r < 2*rem {
		return o.send(o.ctx, r-1, buf)
	}
	return nil
}

// treeReduce reduces in over all ranks into out on root, along a binomial
// tree rooted there: a rank receives from its children (relative ranks
// vr|1, vr|2, vr|4, ... below its lowest set bit), combines, and sends to
// its parent. out is only used on root, and may be in (in place).
func (o *opState) treeReduce(root int, in, out Buffer, op Op) error {
	p, r := o.c.size, o.c.rank
	vr := mod(r-root, p)
	work := out
	if r != root {
		work = o.scratch(slotWork, in.dt, in.Len())
	}
	tmp := o.scratch(slotTmp, in.dt, in.Len())
	cur := in
	for mask := 1; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			return o.send(o.ctx, mod(vr-mask+root, p), cur)
		}
		if child := vr | mask; child < p {
			if err := o.recv(o.ctx, mod(child+root, p), tmp); err != nil {
				return err
			}
			reduceInto(op, work, cur, tmp)
			cur = work
		}
	}
	copyInto(out, cur)
	if op == Avg {
		divide(out, p)
	}
	return nil
}

// treeBroadcast sends buf from root along a binomial tree: a rank receives
// from its parent, then sends to its children, largest subtree first.
func (o *opState) treeBroadcast(root int, buf Buffer) error {
	p, r := o.c.size, o.c.rank
	vr := mod(r-root, p)
	mask := 1
	for ; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			if err := o.recv(o.ctx, mod(vr-mask+root, p), buf); err != nil {
				return err
			}
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < p {
			if err := o.send(o.ctx, mod(vr+mask+root, p), buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// allReduceSmall all-reduces buf with rd or tree (tree: reduce to rank 0,
// then broadcast from it).
func (o *opState) allReduceSmall(alg algorithm, buf Buffer, op Op) error {
	if alg != algTree {
		return o.rdAllReduce(buf, op)
	}
	if err := o.treeReduce(0, buf, buf, op); err != nil {
		return err
	}
	return o.treeBroadcast(0, buf)
}
