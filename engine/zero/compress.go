package zero

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
)

// Gradient compression of the data-parallel all-reduce (ZeRO stages 0
// and 1), as PyTorch DDP's communication hooks and DeepSpeed compress it:
//
//   - PowerSGD (Vogels et al. 2019, PyTorch's powerSGD_hook): each 2-D
//     gradient M (n×m) travels as P = M·Q (n×r) and Q = Mᵀ·P̂ (m×r), P̂
//     the orthonormalised sum of P, so that M ≈ P̂·Qᵀ; Q is kept from step
//     to step (warm start), and 1-D tensors and matrices that rank r would
//     not shrink at least twofold (PyTorch's min_compression_rate 2) are
//     all-reduced whole with them. The first StartStep optimizer steps are
//     all-reduced whole (start_powerSGD_iter).
//   - int8: blockwise quantisation, 256 values per fp32 scale (absmax/127,
//     rounded to nearest), in two phases as ZeRO++'s qgZ: an all-to-all of
//     quantised chunks, each rank summing its chunk in fp32, then an
//     all-gather of the re-quantised sums. Nothing is summed in int8, and
//     each phase moves (dp-1)/dp of the bucket at 1 + 4/256 bytes a value:
//     3.94 times fewer bytes than an fp32 ring all-reduce.
//
// Both keep error feedback: what a rank's compressed contribution left out
// (its residual) is added to its next step's gradient, so that over steps
// the applied updates plus the ranks' mean residual sum to the sum of the
// true mean gradients (int8's summing rank also keeps the residual of its
// second quantisation, as 1-bit Adam's server error). Residuals are kept
// unscaled (divided by the fp16 loss scale), so a changing scale does not
// change them; a step whose gradients are not finite clears them.
//
// The reductions of a step run on one goroutine, bucket after bucket, in
// the order backward completes them: the same order on every rank, and
// while backward goes on (as DDP runs its hooks on the communication
// stream). At one data-parallel rank nothing travels and nothing is
// compressed.

// CompressKind is a kind of gradient compression.
type CompressKind uint8

// The kinds of gradient compression.
const (
	CompressNone CompressKind = iota
	CompressPowerSGD
	CompressInt8
)

// Compression is how gradients travel between data-parallel ranks.
type Compression struct {
	Kind CompressKind
	// Rank is PowerSGD's matrix_approximation_rank.
	Rank int
	// StartStep is PowerSGD's start_powerSGD_iter: the number of optimizer
	// steps whose gradients are all-reduced whole before compression starts.
	StartStep int
}

// MaxPowerSGDRank bounds PowerSGD's rank: far above the 1 to 8 that the
// paper and PyTorch's users choose, and a typo must not size buffers.
const MaxPowerSGDRank = 1024

// Int8Block is the values per fp32 scale of int8 compression.
const Int8Block = 256

// ParseCompression reads parallel.grad_compression: none (or empty),
// int8, or powersgd:RANK.
func ParseCompression(s string) (Compression, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); {
	case v == "" || v == "none":
		return Compression{}, nil
	case v == "int8":
		return Compression{Kind: CompressInt8}, nil
	case strings.HasPrefix(v, "powersgd:"):
		r, err := strconv.Atoi(strings.TrimPrefix(v, "powersgd:"))
		if err != nil || r < 1 || r > MaxPowerSGDRank {
			return Compression{}, fmt.Errorf("zero: grad compression %q: the rank must be a whole number from 1 to %d (powersgd:4 is a common choice)", s, MaxPowerSGDRank)
		}
		return Compression{Kind: CompressPowerSGD, Rank: r}, nil
	case v == "powersgd":
		return Compression{}, fmt.Errorf("zero: grad compression %q: give the rank, e.g. powersgd:4", s)
	}
	return Compression{}, fmt.Errorf("zero: grad compression %q: want none, int8 or powersgd:RANK (e.g. powersgd:4)", s)
}

// String is the spelling ParseCompression reads.
func (c Compression) String() string {
	switch c.Kind {
	case CompressPowerSGD:
		return fmt.Sprintf("powersgd:%d", c.Rank)
	case CompressInt8:
		return "int8"
	}
	return "none"
}

// validate refuses compression where it does not apply.
func (c Compression) validate(stage int) error {
	switch {
	case c.Kind == CompressNone:
		return nil
	case c.Kind == CompressPowerSGD && (c.Rank < 1 || c.Rank > MaxPowerSGDRank):
		return fmt.Errorf("zero: grad compression powersgd:%d: the rank must be 1 to %d", c.Rank, MaxPowerSGDRank)
	case c.StartStep < 0:
		return fmt.Errorf("zero: grad compression %s: start step %d must not be negative", c, c.StartStep)
	case stage >= 2:
		return fmt.Errorf("zero: grad compression %s at ZeRO stage %d: it compresses the all-reduce of stages 0 and 1; stages 2 and 3 reduce-scatter gradient shards, which a low-rank or requantised sum does not compose with: use zero_stage 0 or 1, or grad_compression none", c, stage)
	}
	return nil
}

// compressor is a rank's compression state and the goroutine that runs a
// step's compressed reductions.
type compressor struct {
	cfg    Compression
	c      *comm.Communicator
	segs   []Segment
	params []model.Param
	resid  []float32 // this rank's residual, in the flat layout, unscaled
	work   []float32 // fp32 gradients of a bucket of 16-bit gradients
	low    *lowRank  // PowerSGD
	q8     *int8Sum  // int8

	jobs chan job   // the step's buckets, nil when no step is under way
	done chan error // the goroutine's first error, once jobs is closed
	note string     // what Load did with the saved state, for the run's log
}

// job is one bucket to reduce.
type job struct {
	ctx   context.Context
	seg   int
	g     comm.Buffer // the bucket's gradients, reduced in place
	scale float32     // the loss scale the gradients carry
	whole bool        // all-reduce uncompressed (PowerSGD's first steps)
}

// newCompressor is the compression state of a rank of c, nil when nothing
// is compressed (none, or one rank).
func newCompressor(cfg Compression, c *comm.Communicator, segs []Segment, params []model.Param, n int) *compressor {
	if cfg.Kind == CompressNone || c == nil || c.Size() < 2 {
		return nil
	}
	z := &compressor{cfg: cfg, c: c, segs: segs, params: params, resid: make([]float32, n)}
	switch cfg.Kind {
	case CompressPowerSGD:
		z.low = newLowRank(cfg.Rank, segs, params)
	case CompressInt8:
		z.q8 = newInt8Sum(segs, c.Size(), c.Rank())
	}
	return z
}

// submit queues bucket seg's reduction, starting the step's goroutine at
// the first bucket.
func (z *compressor) submit(j job) {
	if z.jobs == nil {
		z.jobs, z.done = make(chan job, len(z.segs)), make(chan error, 1)
		go z.run(z.jobs, z.done)
	}
	z.jobs <- j
}

// run reduces the queued buckets in order. After a failure it only drains
// the queue: the communicator has failed for every later bucket too.
func (z *compressor) run(jobs <-chan job, done chan<- error) {
	var first error
	for j := range jobs {
		if first == nil {
			first = z.reduce(j)
		}
	}
	done <- first
}

// wait ends the step's goroutine once it has reduced every bucket queued.
func (z *compressor) wait() error {
	if z.jobs == nil {
		return nil
	}
	close(z.jobs)
	err := <-z.done
	z.jobs, z.done = nil, nil
	return err
}

// reduce averages one bucket's gradients over the ranks, compressed.
func (z *compressor) reduce(j job) error {
	if j.whole { // in the gradients' own type, as without compression
		return z.c.AllReduce(j.ctx, j.g, comm.Avg)
	}
	s := z.segs[j.seg]
	x := z.fp32(j.g, s)
	var err error
	switch {
	case z.low != nil:
		err = z.low.reduce(j.ctx, z.c, j.seg, x, z.resid[s.Offset:s.Offset+s.Size], s.Offset, j.scale)
	default:
		err = z.q8.reduce(j.ctx, z.c, j.seg, x, z.resid[s.Offset:s.Offset+s.Size], j.scale)
	}
	if j.g.DType() != comm.Float32 {
		encode(j.g, x)
	}
	return err
}

// fp32 is the bucket's gradients as float32: a view of fp32 ones, else
// decoded into the compressor's scratch.
func (z *compressor) fp32(g comm.Buffer, s Segment) []float32 {
	if g.DType() == comm.Float32 {
		return g.Float32s()
	}
	if z.work == nil {
		z.work = make([]float32, len(z.resid))
	}
	x := z.work[s.Offset : s.Offset+s.Size]
	decode(x, g)
	return x
}

// reset clears the residuals and restarts PowerSGD's warm start: after a
// step whose gradients were not finite they may hold NaN or Inf, which
// error feedback would add to every later step.
func (z *compressor) reset() {
	clear(z.resid)
	if z.low != nil {
		z.low.initQ()
	}
	if z.q8 != nil {
		clear(z.q8.resid)
	}
}

// addScaled is x += scale·r.
func addScaled(x, r []float32, scale float32) {
	r = r[:len(x)]
	for i := range x {
		x[i] += scale * r[i]
	}
}

// keepResidual is r = (x - y)/scale: what y, the value that travelled,
// left out of x, unscaled.
func keepResidual(r, x, y []float32, scale float32) {
	inv := 1 / scale
	r, y = r[:len(x)], y[:len(x)]
	for i := range x {
		r[i] = (x[i] - y[i]) * inv
	}
}

// compress queues segment i's all-reduce on the compressor, if there is
// one. PowerSGD's first StartStep optimizer steps travel whole.
func (e *Engine) compress(i int) bool {
	if e.cz == nil {
		return false
	}
	s := e.part.Segments[i]
	e.cz.submit(job{ctx: e.ctx, seg: i, g: e.grads.Slice(s.Offset, s.Offset+s.Size), scale: float32(e.scaler.Scale),
		whole: e.cz.low != nil && e.opt.Step < e.cfg.Compress.StartStep})
	return true
}

// bytes is the memory of the compression state and scratch (0 for none).
func (z *compressor) bytes() int64 {
	if z == nil {
		return 0
	}
	n := len(z.resid) + len(z.work)
	if l := z.low; l != nil {
		n += len(l.buf) + len(l.row)
		for _, mt := range l.mats {
			n += len(mt.q) + len(mt.p)
		}
	}
	if q := z.q8; q != nil {
		n += len(q.resid) + len(q.sum) + len(q.deq) + len(q.gather)
		for j := range q.packs {
			n += len(q.packs[j]) + len(q.recv[j])
		}
	}
	return int64(n) * 4
}
