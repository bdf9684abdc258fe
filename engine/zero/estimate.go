package zero

import (
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
)

// Estimate is the memory rank (of ranks) will hold for a model of mcfg,
// worked out without allocating it, so that a job too large for its
// machine can be refused before it starts. Params, Grads and Optimizer are
// exactly what Memory reports once New has run; Buffers is an upper
// estimate of what the transient buffers reach in training (the pool's
// high-water mark depends on the order in which collectives finish).
func Estimate(cfg Config, mcfg model.Config, ranks, rank int) Memory {
	units := mcfg.Units()
	part := partition(cfg, units, ranks, rank)
	n, owned := int64(mcfg.NumParams()), int64(part.Size())
	ps, gs := int64(cfg.Params.Size()), int64(cfg.Grads.Size())
	m := Memory{Params: n * ps, Grads: n * gs, Optimizer: 2 * owned * 4}
	if cfg.Stage == 3 {
		m.Params = owned * ps
	}
	if cfg.Stage >= 2 {
		m.Grads = owned * gs
	}
	if cfg.Params != comm.Float32 {
		m.Optimizer += owned * 4 // the separate fp32 master weights
	}
	m.Buffers = estimateBuffers(cfg, units, part)
	return m
}

// estimateBuffers bounds the pool (see pool): the units the model holds at
// once in fp32 (the embedding, which the tied output layer uses again at
// the end, and a block with the next one prefetched), decoded from the
// working type or gathered (stage 3) — with bf16 parameters only the last
// unit (the final layer norm) is decoded, the model multiplying by the
// bf16 ones as they are (WeightsBF16); backward's gradient scratch in fp32
// when gradients are kept in 16 bits; and at stages 2–3 the buckets in flight
// and the parts of them received to accumulate.
func estimateBuffers(cfg Config, units []model.Unit, part Partition) int64 {
	var emb, block int64
	for i, u := range units {
		if i == 0 {
			emb = int64(u.Size)
		} else {
			block = max(block, int64(u.Size))
		}
	}
	held := emb + 2*block
	ps, gs := int64(cfg.Params.Size()), int64(cfg.Grads.Size())
	var b int64
	switch {
	case cfg.Params == comm.BFloat16:
		b += int64(units[len(units)-1].Size) * 4
	case cfg.Params != comm.Float32 || cfg.Stage == 3:
		b += held * 4
	}
	if cfg.Stage == 3 {
		b += held * ps
	}
	if cfg.Grads != comm.Float32 { // the step decodes them a block at a time, on the stack
		b += held * 4
	}
	if cfg.Stage >= 2 {
		var seg, mine int64
		for i, s := range part.Segments {
			lo, hi, _ := part.Owned(i)
			seg, mine = max(seg, int64(s.Size)), max(mine, int64(hi-lo))
		}
		// Buckets being filled or on the wire, and what each reduce-scatter
		// receives (the rank's part of a bucket) when it adds to earlier
		// micro-batches' gradients.
		b += (maxInFlight+1)*seg*gs + maxInFlight*mine*gs
	}
	return b
}
