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
// working type or gathered (stage 3); gradient scratch in fp32 when
// gradients are kept in 16 bits; and at stages 2–3 the buckets in flight
// and the owned part they accumulate into.
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
	owned := int64(part.Size())
	ps, gs := int64(cfg.Params.Size()), int64(cfg.Grads.Size())
	var b int64
	if cfg.Params != comm.Float32 || cfg.Stage == 3 {
		b += held * 4
	}
	if cfg.Stage == 3 {
		b += held * ps
	}
	if cfg.Grads != comm.Float32 {
		b += held*4 + owned*4
	}
	if cfg.Stage >= 2 {
		var seg int64
		for _, s := range part.Segments {
			seg = max(seg, int64(s.Size))
		}
		b += (maxInFlight+1)*seg*gs + owned*gs
	}
	return b
}
