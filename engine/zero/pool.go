package zero

import "github.com/gtrain/gtrain/engine/comm"

// pool recycles the engine's transient buffers (buckets, gathered layers,
// fp32 scratch) by type and length. Nothing is ever freed to the garbage
// collector, so bytes is the most the engine has held at once: the
// communication-buffer figure of its memory report.
type pool struct {
	free  map[poolKey][]comm.Buffer
	bytes int64
}

type poolKey struct {
	dt comm.DType
	n  int
}

// get returns a buffer of n elements of dt; its contents are undefined.
func (p *pool) get(dt comm.DType, n int) comm.Buffer {
	k := poolKey{dt, n}
	if fs := p.free[k]; len(fs) > 0 {
		b := fs[len(fs)-1]
		p.free[k] = fs[:len(fs)-1]
		return b
	}
	p.bytes += int64(n * dt.Size())
	return comm.NewBuffer(dt, n)
}

// put returns b for reuse.
func (p *pool) put(b comm.Buffer) {
	if b.Len() == 0 {
		return
	}
	if p.free == nil {
		p.free = map[poolKey][]comm.Buffer{}
	}
	k := poolKey{b.DType(), b.Len()}
	p.free[k] = append(p.free[k], b)
}

// f32 returns n float32s from the pool; their contents are undefined.
func (p *pool) f32(n int) []float32 { return p.get(comm.Float32, n).Float32s() }

// putF32 returns a slice f32 gave out.
func (p *pool) putF32(s []float32) { p.put(comm.F32(s)) }
