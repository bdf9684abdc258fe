package zero

import (
	"context"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
)

// int8Sum is int8 compression's state: the chunk of each bucket this
// rank sums (comm.Block's split), the residual of its re-quantised sums,
// and scratch. A packed chunk of n values is ⌈n/Int8Block⌉ fp32 scales
// then n int8 codes, padded to whole float32 words: comm moves float32
// buffers, and a pack only travels (it is never summed as floats).
type int8Sum struct {
	ranks, rank int
	at          []int     // where each bucket's own chunk starts in resid
	resid       []float32 // residuals of the own chunks' sums, unscaled
	packs       [][]float32
	recv        [][]float32
	sum, deq    []float32
	gather      []float32
}

// newInt8Sum is rank's int8 state for the buckets segs over ranks ranks.
func newInt8Sum(segs []Segment, ranks, rank int) *int8Sum {
	q := &int8Sum{ranks: ranks, rank: rank, at: make([]int, len(segs)),
		packs: make([][]float32, ranks), recv: make([][]float32, ranks)}
	n, most := 0, 0
	for i, s := range segs {
		q.at[i] = n
		lo, hi := comm.Block(s.Size, rank, ranks)
		n += hi - lo
		most = max(most, s.Size)
	}
	q.resid = make([]float32, n)
	chunk := (most + ranks - 1) / ranks
	for j := range ranks {
		q.packs[j] = make([]float32, packWords(chunk))
		q.recv[j] = make([]float32, packWords(chunk))
	}
	q.sum, q.deq = make([]float32, chunk), make([]float32, chunk)
	q.gather = make([]float32, ranks*packWords(chunk))
	return q
}

// packWords is the float32 words of a packed chunk of n values.
func packWords(n int) int { return (n+Int8Block-1)/Int8Block + (n+3)/4 }

// reduce averages bucket seg's gradients x over the ranks of c: each rank
// quantises its x (plus its residual resid, keeping the new one), sends
// chunk j to rank j and receives its own chunk from every rank, sums them
// in fp32 in rank order, re-quantises the mean (plus that sum's residual),
// and all-gathers the packs; every rank decodes the same bytes.
func (q *int8Sum) reduce(ctx context.Context, c *comm.Communicator, seg int, x, resid []float32, scale float32) error {
	d, me := q.ranks, q.rank
	addScaled(x, resid, scale)
	for j := range d {
		lo, hi := comm.Block(len(x), j, d)
		quantize(q.packs[j][:packWords(hi-lo)], x[lo:hi], q.deq[:hi-lo])
		keepResidual(resid[lo:hi], x[lo:hi], q.deq, scale)
	}
	lo, hi := comm.Block(len(x), me, d)
	own := hi - lo
	if err := q.exchange(ctx, c, len(x), own); err != nil {
		return err
	}
	sum := q.sum[:own]
	clear(sum)
	for k := range d { // rank order: the same sum on any rank that did it
		pk := q.recv[k]
		if k == me {
			pk = q.packs[me]
		}
		dequantize(q.deq[:own], pk[:packWords(own)])
		for i, v := range q.deq[:own] {
			sum[i] += v
		}
	}
	inv := 1 / float32(d)
	for i := range sum {
		sum[i] *= inv
	}
	r := q.resid[q.at[seg] : q.at[seg]+own]
	addScaled(sum, r, scale)
	words := packWords((len(x) + d - 1) / d)
	mine := q.gather[me*words : (me+1)*words]
	quantize(mine[:packWords(own)], sum, q.deq[:own])
	keepResidual(r, sum, q.deq, scale)
	if err := c.AllGather(ctx, comm.F32(mine), comm.F32(q.gather[:d*words])); err != nil {
		return err
	}
	for j := range d {
		lo, hi := comm.Block(len(x), j, d)
		dequantize(x[lo:hi], q.gather[j*words:j*words+packWords(hi-lo)])
	}
	return nil
}

// exchange is the all-to-all of the packed chunks: in round s every rank
// sends to the rank s after it and receives from the rank s before it, so
// each pair of ranks meets once and no rank waits on a busy one.
func (q *int8Sum) exchange(ctx context.Context, c *comm.Communicator, n, own int) error {
	d, me := q.ranks, q.rank
	hs := make([]*comm.Handle, 0, d-1)
	for s := 1; s < d; s++ {
		to, from := (me+s)%d, (me-s+d)%d
		lo, hi := comm.Block(n, to, d)
		hs = append(hs, c.SendRecvAsync(ctx, comm.F32(q.packs[to][:packWords(hi-lo)]), to,
			comm.F32(q.recv[from][:packWords(own)]), from))
	}
	var first error
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// quantize packs x into pk (packWords(len(x)) words) and writes what the
// pack decodes to into deq. Each block's scale is its absolute maximum
// over 127, and values round to the nearest code, so a decoded value is
// within scale/2 of x. A block holding NaN or ±Inf gets a NaN scale: it
// decodes to NaN, which the step's finite check sees, instead of turning
// into finite garbage.
func quantize(pk, x, deq []float32) {
	n := len(x)
	nb := (n + Int8Block - 1) / Int8Block
	scales, codes := pk[:nb], comm.F32(pk[nb:]).Bytes()[:n]
	for b := range nb {
		lo, hi := b*Int8Block, min(n, (b+1)*Int8Block)
		var amax float32
		finite := true
		for _, v := range x[lo:hi] {
			a := float32(math.Abs(float64(v)))
			if a > amax {
				amax = a
			} else if a != a {
				finite = false
			}
		}
		finite = finite && !math.IsInf(float64(amax), 0)
		s, inv := amax/127, float32(0)
		switch {
		case !finite:
			s = float32(math.NaN())
		case amax > 0:
			inv = 127 / amax
		}
		scales[b] = s
		for i := lo; i < hi; i++ {
			v := x[i] * inv
			if !finite {
				v = 0
			}
			c := int32(v + float32(math.Copysign(0.5, float64(v))))
			c = max(-127, min(127, c))
			codes[i] = byte(int8(c))
			deq[i] = float32(c) * s
		}
	}
}

// dequantize decodes the pack pk into x.
func dequantize(x, pk []float32) {
	n := len(x)
	nb := (n + Int8Block - 1) / Int8Block
	scales, codes := pk[:nb], comm.F32(pk[nb:]).Bytes()[:n]
	for i := range x {
		x[i] = float32(int8(codes[i])) * scales[i/Int8Block]
	}
}
