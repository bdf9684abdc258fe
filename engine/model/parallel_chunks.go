package model

import (
	"fmt"

	"github.com/gtrain/gtrain/engine/pipeline"
)

// An interleaved rank (StageSpec.Chunks v > 1) is a Stage for its chunk 0
// with chunks 1 … v−1 in more, each a one-chunk Stage of its own virtual
// stage: its layers, its dims (first and last virtual stage decide where
// the embedding and the head are), its activation sets and losses. What
// the chunks can share they do, since the rank runs one pass at a time:
// the flat Params and Grads (each chunk's tensors one run of them, its
// shards' offsets global), recomputation's working set and backward's
// scratch (their widths do not depend on the layers). Activation sets are
// kept per chunk: their shapes differ with the layers and the head.

// chunkedStages is the pipeline stages of a split into virtual stages
// counted by Split's length, for chunks per rank (0 meaning 1), or why it
// cannot be interleaved.
func chunkedStages(virtual, chunks int) (int, error) {
	v := max(chunks, 1)
	switch {
	case chunks < 0 || chunks > pipeline.MaxChunks:
		return 0, fmt.Errorf("model: stage: %d model chunks per rank: want 1 to %d", chunks, pipeline.MaxChunks)
	case virtual%v != 0:
		return 0, fmt.Errorf("model: stage: %d virtual stages do not divide into %d chunks per rank: give one layer count per virtual stage (pp × chunks)", virtual, v)
	case v > 1 && virtual/v < 2:
		return 0, fmt.Errorf("model: stage: %d model chunks on 1 pipeline stage: interleaving needs at least 2 stages", v)
	}
	return virtual / v, nil
}

// chunks is the rank's chunks in order, the Stage itself first.
func (s *Stage) chunks() []*Stage { return append([]*Stage{s}, s.more...) }

// last is the rank's last chunk, the one that may hold the head.
func (s *Stage) last() *Stage {
	if k := len(s.more); k > 0 {
		return s.more[k-1]
	}
	return s
}

// tiedChunk is the chunk holding a copy of the tied token embedding (the
// first virtual stage's or the last's), or nil.
func (s *Stage) tiedChunk() *Stage {
	for _, c := range s.chunks() {
		if c.g.wte != nil {
			return c
		}
	}
	return nil
}

// chunkAt is chunk c of the rank, or why a pass cannot run on it.
func (s *Stage) chunkAt(op string, c int) (*Stage, error) {
	if c < 0 || c > len(s.more) {
		return nil, fmt.Errorf("model: stage %d: %s of model chunk %d: the rank holds %d", s.index, op, c, len(s.more)+1)
	}
	if c == 0 {
		return s, nil
	}
	return s.more[c-1], nil
}

// Chunks is the number of model chunks the stage holds.
func (s *Stage) Chunks() int { return len(s.more) + 1 }

// ChunkLayers is the range [first, end) of the blocks of chunk c, which is
// in range.
func (s *Stage) ChunkLayers(c int) (first, end int) {
	k := s.chunks()[c]
	return k.first, k.end
}

// pack gives the chunks their parameters, gradients and shared buffers
// (see the top of the file), counts their activation memory, and makes
// Shards the rank's tensors, chunk after chunk.
func (s *Stage) pack(attScratch int) {
	cs := s.chunks()
	n := 0
	for _, c := range cs {
		for i := range c.shards {
			c.shards[i].Offset += n
		}
		if k := len(c.shards); k > 0 {
			n = c.shards[k-1].Offset + c.shards[k-1].Size()
		}
	}
	params, grads := make([]float32, n), make([]float32, n)
	for _, c := range cs {
		c.Params, c.Grads = params, grads
		c.w, c.g = c.views(params), c.views(grads)
		c.use = c.countUse(attScratch)
	}
	s.newWork(&sizer{}, attScratch)
	for _, c := range s.more {
		c.use.shared = ActivationUse{}
		c.work, c.sc = s.work, s.sc
		s.shards = append(s.shards, c.shards...)
	}
}

// chunkUse is the activation memory of the rank's chunks, chunk c with
// sets[c] activation sets, the shared buffers counted once.
func chunkUse(uses []stageUse, sets []int) ActivationUse {
	var t ActivationUse
	for c, u := range uses {
		a := u.times(sets[c])
		t.Layers += a.Layers
		t.Head += a.Head
		t.Working += a.Working
		t.Other += a.Other
	}
	return t
}
