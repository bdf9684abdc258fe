package zero

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
)

// minCompressionRate is PyTorch's min_compression_rate: a matrix is
// compressed only when rank r shrinks what it sends at least this much,
// n·m > rate·(n+m)·r; below that the two round trips cost more than they
// save.
const minCompressionRate = 2

// lowRank is PowerSGD's state: the warm-start Q of every compressed
// matrix, and what each bucket sends.
type lowRank struct {
	mats  []matrix
	plans []lowRankPlan // by segment
	buf   []float32     // scratch: a bucket's whole values and Ps, or its Qs
	row   []float32     // scratch: one row of P̂·Qᵀ
}

// matrix is a gradient PowerSGD compresses: the parameter viewed as n×m
// (its first dimension by the rest, as PyTorch views it), approximated at
// rank r, and its Q (m×r, row-major), the same on every rank.
type matrix struct {
	param   model.Param
	n, m, r int
	q       []float32
	p       []float32 // P̂ (n×r) of the step under way
	seed    uint64
}

// lowRankPlan is what a bucket sends: the flat ranges all-reduced whole
// (1-D tensors, matrices too small to gain) and the matrices compressed.
type lowRankPlan struct {
	whole      [][2]int
	mats       []int // indices into mats
	wholeN, pN int   // elements all-reduced whole, and of the Ps
	qN         int   // elements of the Qs
}

// newLowRank plans rank-r PowerSGD over the buckets segs of params.
func newLowRank(rank int, segs []Segment, params []model.Param) *lowRank {
	l := &lowRank{plans: make([]lowRankPlan, len(segs))}
	maxRow := 0
	for si, s := range segs {
		pl := &l.plans[si]
		for _, p := range params {
			if p.Offset < s.Offset || p.Offset >= s.Offset+s.Size {
				continue
			}
			lo, hi := p.Offset, p.Offset+p.Size()
			mt, ok := compressible(p, rank)
			if !ok {
				if k := len(pl.whole) - 1; k >= 0 && pl.whole[k][1] == lo {
					pl.whole[k][1] = hi // adjacent: one copy
				} else {
					pl.whole = append(pl.whole, [2]int{lo, hi})
				}
				pl.wholeN += hi - lo
				continue
			}
			mt.seed = uint64(len(l.mats))
			pl.mats = append(pl.mats, len(l.mats))
			pl.pN += mt.n * mt.r
			pl.qN += mt.m * mt.r
			maxRow = max(maxRow, mt.m)
			l.mats = append(l.mats, mt)
		}
	}
	l.row = make([]float32, maxRow)
	l.initQ()
	return l
}

// compressible is p as a PowerSGD matrix, if it is one worth compressing.
func compressible(p model.Param, rank int) (matrix, bool) {
	if len(p.Shape) < 2 || p.Shape[0] == 0 {
		return matrix{}, false
	}
	n := p.Shape[0]
	m := p.Size() / n
	r := min(n, m, rank)
	if n*m <= minCompressionRate*(n+m)*r {
		return matrix{}, false
	}
	return matrix{param: p, n: n, m: m, r: r, q: make([]float32, m*r), p: make([]float32, n*r)}, true
}

// initQ draws every Q from a standard normal distribution, seeded by the
// matrix's index: the same on every rank, as PyTorch seeds them alike.
func (l *lowRank) initQ() {
	for i := range l.mats {
		rng := rand.New(rand.NewPCG(l.mats[i].seed, 0x9e3779b97f4a7c15))
		for j := range l.mats[i].q {
			l.mats[i].q[j] = float32(rng.NormFloat64())
		}
	}
}

// scratch is l.buf with n elements.
func (l *lowRank) scratch(n int) []float32 {
	if cap(l.buf) < n {
		l.buf = make([]float32, n)
	}
	return l.buf[:n]
}

// reduce averages bucket seg's gradients x (flat offset off) over the
// ranks of c: the whole values and the Ps in one all-reduce, the Qs in a
// second; resid is the bucket's residual, added before and kept after.
func (l *lowRank) reduce(ctx context.Context, c *comm.Communicator, seg int, x, resid []float32, off int, scale float32) error {
	pl := &l.plans[seg]
	buf := l.scratch(pl.wholeN + pl.pN)
	at := 0
	for _, w := range pl.whole {
		at += copy(buf[at:], x[w[0]-off:w[1]-off])
	}
	for _, k := range pl.mats {
		mt := &l.mats[k]
		lo := mt.param.Offset - off
		addScaled(x[lo:lo+mt.n*mt.m], resid[lo:], scale)
		mulMQ(buf[at:at+mt.n*mt.r], x[lo:], mt.q, mt.n, mt.m, mt.r)
		at += mt.n * mt.r
	}
	if err := c.AllReduce(ctx, comm.F32(buf), comm.Sum); err != nil {
		return err
	}
	d := float32(c.Size())
	at = 0
	for _, w := range pl.whole {
		for i := w[0] - off; i < w[1]-off; i++ {
			x[i] = buf[at] / d
			at++
		}
	}
	for _, k := range pl.mats { // out of buf, which the Qs reuse
		mt := &l.mats[k]
		at += copy(mt.p, buf[at:at+len(mt.p)])
		orthogonalize(mt.p, mt.n, mt.r)
	}
	return l.second(ctx, c, pl, x, resid, off, scale)
}

// second is PowerSGD's second round trip: Q = Mᵀ·P̂ summed over the ranks
// and averaged (kept as the next step's warm start), then M ≈ P̂·Qᵀ.
func (l *lowRank) second(ctx context.Context, c *comm.Communicator, pl *lowRankPlan, x, resid []float32, off int, scale float32) error {
	buf := l.scratch(pl.qN)
	at := 0
	for _, k := range pl.mats {
		mt := &l.mats[k]
		lo := mt.param.Offset - off
		mulMtP(buf[at:at+mt.m*mt.r], x[lo:], mt.p, mt.n, mt.m, mt.r)
		at += mt.m * mt.r
	}
	if err := c.AllReduce(ctx, comm.F32(buf), comm.Sum); err != nil {
		return err
	}
	d := float32(c.Size())
	at = 0
	for _, k := range pl.mats {
		mt := &l.mats[k]
		for j := range mt.q {
			mt.q[j] = buf[at+j] / d
		}
		at += len(mt.q)
		lo := mt.param.Offset - off
		l.decompress(x[lo:lo+mt.n*mt.m], resid[lo:], mt, scale)
	}
	return nil
}

// decompress replaces M by P̂·Qᵀ, row by row, keeping what it leaves out
// of M as the residual.
func (l *lowRank) decompress(mx, resid []float32, mt *matrix, scale float32) {
	n, m, r, p := mt.n, mt.m, mt.r, mt.p
	row := l.row[:m]
	for i := range n {
		pi := p[i*r : i*r+r]
		for j := range m {
			qj := mt.q[j*r : j*r+r]
			var s float32
			for k, v := range pi {
				s += v * qj[k]
			}
			row[j] = s
		}
		mi := mx[i*m : i*m+m]
		keepResidual(resid[i*m:i*m+m], mi, row, scale)
		copy(mi, row)
	}
}

// mulMQ is P = M·Q: M n×m, Q m×r, P n×r, all row-major.
func mulMQ(p, mx, q []float32, n, m, r int) {
	for i := range n {
		pi := p[i*r : i*r+r]
		clear(pi)
		for j, a := range mx[i*m : i*m+m] {
			for k, b := range q[j*r : j*r+r] {
				pi[k] += a * b
			}
		}
	}
}

// mulMtP is Q = Mᵀ·P: M n×m, P n×r, Q m×r, all row-major.
func mulMtP(q, mx, p []float32, n, m, r int) {
	clear(q)
	for i := range n {
		pi := p[i*r : i*r+r]
		for j, a := range mx[i*m : i*m+m] {
			qj := q[j*r : j*r+r]
			for k, b := range pi {
				qj[k] += a * b
			}
		}
	}
}

// orthogonalize makes the r columns of p (n×r, row-major) orthonormal by
// Gram-Schmidt, as PyTorch's _orthogonalize_gram_schmidt, with two
// projection passes and float64 sums: one pass leaves a column that
// depended on the earlier ones as rounding noise pointing anywhere, and
// normalised it would add a direction M does not have. A column with less
// than depTol of its norm left after the projections (a gradient of lower
// rank than r, or zero) becomes zero rather than noise or NaN: it then
// adds nothing to P̂·Qᵀ.
func orthogonalize(p []float32, n, r int) {
	for c := range r {
		before := colNorm(p, n, r, c)
		for range 2 {
			for e := range c {
				var dot float64
				for i := range n {
					dot += float64(p[i*r+e]) * float64(p[i*r+c])
				}
				f := float32(dot)
				for i := range n {
					p[i*r+c] -= f * p[i*r+e]
				}
			}
		}
		norm, inv := colNorm(p, n, r, c), float32(0)
		if norm > depTol*before {
			inv = float32(1 / norm)
		}
		for i := range n {
			p[i*r+c] *= inv
		}
	}
}

// depTol is the part of a column's norm that must remain after the
// projections for it to count as a new direction: far above float32
// rounding (1e-7 a term), far below what a real direction keeps.
const depTol = 1e-4

func colNorm(p []float32, n, r, c int) float64 {
	var ss float64
	for i := range n {
		v := float64(p[i*r+c])
		ss += v * v
	}
	return math.Sqrt(ss)
}
