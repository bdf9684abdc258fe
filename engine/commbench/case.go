package commbench

import (
	"context"
	"math"

	"github.com/gtrain/gtrain/engine/comm"
)

// bcase is one collective at one size on one rank: its buffers, the
// pristine input to reset them from, and how to run and check it.
type bcase struct {
	name            string
	rank, p, root   int
	count, block    int // whole buffer; this rank's block (reduce_scatter, all_gather)
	dt              comm.DType
	op              comm.Op
	reduces, rooted bool
	outOfPlace      bool // has an out-of-place form
	inPlaceOnly     bool // has only the in-place form
	a, b, pristine  comm.Buffer
	off             int // offset of this rank's block
	resets          int // times reset has run (tests)
}

func newCase(name string, rank, p int, cfg Config, count int) *bcase {
	k := &bcase{name: name, rank: rank, p: p, root: cfg.Root, count: count, dt: cfg.DType, op: cfg.Op}
	k.block = count / p
	k.off = rank * k.block
	switch name {
	case "all_reduce":
		k.reduces, k.inPlaceOnly = true, true
		k.a = comm.NewBuffer(k.dt, count)
		k.pristine = k.input(count, 0)
	case "reduce_scatter":
		k.reduces, k.outOfPlace = true, true
		k.a, k.b = comm.NewBuffer(k.dt, count), comm.NewBuffer(k.dt, k.block)
		k.pristine = k.input(count, 0)
	case "all_gather":
		k.outOfPlace = true
		k.a, k.b = comm.NewBuffer(k.dt, k.block), comm.NewBuffer(k.dt, count)
		k.pristine = k.input(k.block, k.off)
	case "broadcast":
		k.rooted, k.inPlaceOnly = true, true
		k.a = comm.NewBuffer(k.dt, count)
		k.pristine = k.input(count, 0)
	case "reduce":
		k.reduces, k.rooted, k.outOfPlace = true, true, true
		k.a, k.b = comm.NewBuffer(k.dt, count), comm.NewBuffer(k.dt, count)
		k.pristine = k.input(count, 0)
	case "sendrecv":
		k.outOfPlace = true
		k.a, k.b = comm.NewBuffer(k.dt, count), comm.NewBuffer(k.dt, count)
		k.pristine = k.input(count, 0)
	}
	return k
}

func (k *bcase) has(inPlace bool) bool {
	if inPlace {
		return !k.outOfPlace || k.name == "reduce_scatter" || k.name == "all_gather" || k.name == "reduce"
	}
	return k.outOfPlace
}

// busFactor converts algorithm bandwidth into bus bandwidth, as nccl-tests
// defines it: the share of the data each rank's link must carry.
func (k *bcase) busFactor(p int) float64 {
	switch k.name {
	case "all_reduce":
		return 2 * float64(p-1) / float64(p)
	case "reduce_scatter", "all_gather":
		return float64(p-1) / float64(p)
	}
	return 1
}

// reset puts the pristine input where the variant reads it. Every rank
// does the same work, so that no rank starts an iteration later than the
// others for it.
func (k *bcase) reset(inPlace bool) {
	k.resets++
	switch {
	case k.name == "all_gather" && inPlace:
		copy(k.b.Slice(k.off, k.off+k.block).Bytes(), k.pristine.Bytes())
	case k.name == "all_gather":
		copy(k.a.Bytes(), k.pristine.Bytes())
	case k.name == "broadcast" && k.rank != k.root:
		fill(k.a, func(int) float64 { return -7 }) // anything but the root's data
	default:
		copy(k.a.Bytes(), k.pristine.Bytes())
	}
}

// run issues the collective once.
func (k *bcase) run(ctx context.Context, c *comm.Communicator, inPlace bool) error {
	switch k.name {
	case "all_reduce":
		return c.AllReduce(ctx, k.a, k.op)
	case "reduce_scatter":
		if inPlace {
			return c.ReduceScatter(ctx, k.a, k.a.Slice(k.off, k.off+k.block), k.op)
		}
		return c.ReduceScatter(ctx, k.a, k.b, k.op)
	case "all_gather":
		if inPlace {
			return c.AllGather(ctx, k.b.Slice(k.off, k.off+k.block), k.b)
		}
		return c.AllGather(ctx, k.a, k.b)
	case "broadcast":
		return c.Broadcast(ctx, k.a, k.root)
	case "reduce":
		recv := k.b
		if inPlace {
			recv = k.a
		}
		return c.Reduce(ctx, k.a, recv, k.op, k.root)
	case "sendrecv":
		return c.SendRecv(ctx, k.a, (k.rank+1)%k.p, k.b, (k.rank+k.p-1)%k.p)
	}
	return nil
}

// wrong counts the elements of this rank's result that differ from the
// reference by more than the documented tolerance.
func (k *bcase) wrong(inPlace bool) int {
	switch k.name {
	case "all_reduce":
		return k.countWrong(k.a, 0, k.reduced)
	case "reduce_scatter":
		out := k.b
		if inPlace {
			out = k.a.Slice(k.off, k.off+k.block)
		}
		return k.countWrong(out, k.off, k.reduced)
	case "all_gather":
		return k.countWrong(k.b, 0, func(i int) (float64, float64) { return value(i/k.block, i), 0 })
	case "broadcast":
		return k.countWrong(k.a, 0, func(i int) (float64, float64) { return value(k.root, i), 0 })
	case "reduce":
		if k.rank != k.root {
			return 0
		}
		out := k.b
		if inPlace {
			out = k.a
		}
		return k.countWrong(out, 0, k.reduced)
	case "sendrecv":
		from := (k.rank + k.p - 1) % k.p
		return k.countWrong(k.b, 0, func(i int) (float64, float64) { return value(from, i), 0 })
	}
	return 0
}

// value is rank r's input at element i of the whole buffer: a small
// integer, exact in every dtype, scrambled so that a block in the wrong
// place shows.
func value(r, i int) float64 {
	h := uint32(i)*2654435761 ^ uint32(r)*40503
	h ^= h >> 15
	return float64(h%9) - 4
}

// input returns this rank's input for n elements starting at element off.
func (k *bcase) input(n, off int) comm.Buffer {
	b := comm.NewBuffer(k.dt, n)
	fill(b, func(i int) float64 { return value(k.rank, off+i) })
	return b
}

// reduced returns the reference result at element i and its tolerance:
// the reduction computed exactly in float64, then rounded as the library
// rounds (the average divides the float32 sum once); the tolerance is the
// bound the library documents for summing p values, (p-1)·u·Σ|x|, which
// is zero while sums stay exact, as they do for moderate p.
func (k *bcase) reduced(i int) (want, tol float64) {
	var sum, abs float64
	acc := value(0, i)
	for r := range k.p {
		x := value(r, i)
		sum += x
		abs += math.Abs(x)
		switch {
		case k.op == comm.Max:
			acc = math.Max(acc, x)
		case k.op == comm.Min:
			acc = math.Min(acc, x)
		}
	}
	u := unitRoundoff(k.dt)
	switch k.op {
	case comm.Max, comm.Min:
		return acc, 0
	case comm.Avg:
		return float64(round(k.dt, float32(round(k.dt, float32(sum)))/float32(k.p))), float64(k.p-1)*u*abs/float64(k.p) + u*math.Abs(sum)/float64(k.p)
	}
	return sum, float64(k.p-1) * u * abs
}

func (k *bcase) countWrong(b comm.Buffer, off int, ref func(int) (float64, float64)) int {
	n := 0
	for i := range b.Len() {
		want, tol := ref(off + i)
		if got := get(b, i); !(math.Abs(got-want) <= tol) {
			n++
		}
	}
	return n
}

func unitRoundoff(dt comm.DType) float64 {
	switch dt {
	case comm.BFloat16:
		return 0x1p-8
	case comm.Float16:
		return 0x1p-11
	}
	return 0x1p-24
}

// round rounds f to dt and back.
func round(dt comm.DType, f float32) float64 {
	switch dt {
	case comm.BFloat16:
		return float64(comm.BF16ToFloat32(comm.BF16FromFloat32(f)))
	case comm.Float16:
		return float64(comm.F16ToFloat32(comm.F16FromFloat32(f)))
	}
	return float64(f)
}

func fill(b comm.Buffer, f func(int) float64) {
	switch b.DType() {
	case comm.Float32:
		s := b.Float32s()
		for i := range s {
			s[i] = float32(f(i))
		}
	case comm.BFloat16:
		s := b.Uint16s()
		for i := range s {
			s[i] = comm.BF16FromFloat32(float32(f(i)))
		}
	case comm.Float16:
		s := b.Uint16s()
		for i := range s {
			s[i] = comm.F16FromFloat32(float32(f(i)))
		}
	}
}

func get(b comm.Buffer, i int) float64 {
	switch b.DType() {
	case comm.BFloat16:
		return float64(comm.BF16ToFloat32(b.Uint16s()[i]))
	case comm.Float16:
		return float64(comm.F16ToFloat32(b.Uint16s()[i]))
	}
	return float64(b.Float32s()[i])
}
