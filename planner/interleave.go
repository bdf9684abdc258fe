package planner

import "fmt"

// Megatron-LM's interleaved 1F1B schedule (Narayanan et al. 2021, section
// 2.2.2; virtual_pipeline_model_parallel_size): each of the p pipeline
// ranks holds v model chunks, the model being split into p·v virtual
// stages, rank i holding virtual stages i, i+p, …, i+(v−1)p. A
// micro-batch goes round the ranks v times, so the bubble shrinks v-fold,
// (p−1)/(v·m) of the ideal time, for v times the point-to-point messages;
// m must be a multiple of p. The first ranks keep more activations: a
// rank warms up with 2(p−i−1) + (v−1)p chunk forwards (Megatron-LM's
// count) where 1F1B runs p−i−1, so the first stage holds about
// p + (p−1)/v micro-batches' worth (Korthikanti et al. 2022, section 4.2:
// 1 + (p−1)/(p·v) times 1F1B's p).

// MaxVirtualStages bounds the model chunks per rank (engine/pipeline's
// MaxChunks).
const MaxVirtualStages = 64

// Chunks is the model chunks per pipeline rank: VirtualStages, 0 meaning 1.
func (l Layout) Chunks() int { return max(l.VirtualStages, 1) }

// Schedule names the pipeline schedule the layout runs, as engine/pipeline
// spells it: "interleaved" with virtual stages, "1f1b" with a pipeline,
// "" without.
func (l Layout) Schedule() string {
	switch {
	case l.Chunks() > 1:
		return "interleaved"
	case l.PP > 1:
		return "1f1b"
	}
	return ""
}

// interleaveReason is why the layout's virtual stages cannot run with m
// micro-batches, or "".
func interleaveReason(m Model, l Layout, micros int) string {
	v := l.Chunks()
	switch {
	case v == 1:
		return ""
	case l.PP < 2:
		return fmt.Sprintf("virtual stages %d with pp %d: interleaving needs at least 2 pipeline stages", v, l.PP)
	case l.PP*v > m.Layers:
		return fmt.Sprintf("virtual stages %d: pp %d × %d = %d model chunks, more than the %d layers", v, l.PP, v, l.PP*v, m.Layers)
	case micros%l.PP != 0:
		return fmt.Sprintf("virtual stages %d: %d micro-batches is not a multiple of pp %d, as the interleaved schedule needs", v, micros, l.PP)
	}
	return ""
}

// ChunkInFlight is, for each model chunk of pipeline rank i of p under
// the interleaved schedule of v chunks over m micro-batches (a valid one:
// p ≥ 2, m a multiple of p), the most micro-batches whose forward through
// that chunk the rank has run and whose backward it has not: the
// activation sets an engine that keeps them per chunk holds (the built-in
// one). It follows engine/pipeline's order of operations in closed form
// (a test there holds the two equal): with m = p every forward runs
// first; otherwise the rank warms up with w = 2(p−i−1) + (v−1)p chunk
// forwards, then alternates one forward and one backward, the forwards
// taking chunks 0, 1, … and the backwards v−1, v−2, … in groups of p
// micro-batches. The counts repeat every p·v steps, so the peaks are
// found in the first p·v.
func ChunkInFlight(p, m, v, i int) []int {
	peak := make([]int, v)
	if m == p {
		for c := range peak {
			peak[c] = m
		}
		return peak
	}
	total := m * v
	w := min(2*(p-i-1)+(v-1)*p, total)
	// forwards(c, n) is how many of the first n forwards go through chunk c.
	forwards := func(c, n int) int { return n/(p*v)*p + min(max(n%(p*v)-c*p, 0), p) }
	for j := range max(min(p*v, total-w), 1) {
		for c := range peak {
			done := min(w+j+1, total)
			peak[c] = max(peak[c], forwards(c, done)-forwards(v-1-c, j))
		}
	}
	return peak
}

// chunkLayers is the layers of each of rank i's v chunks when layers are
// split over p·v virtual stages as StageLayers does.
func chunkLayers(layers, p, v, i int) []int {
	ls := make([]int, v)
	for c := range ls {
		ls[c] = stageLayers(layers, p*v, c*p+i)
	}
	return ls
}

// interleavedActivations is what rank st of an interleaved layout keeps:
// each chunk's layers × the micro-batches in flight through it, and on the
// last rank the head for those of its last chunk. It returns the bytes
// and the chunk activation sets in flight.
func (ev *evaluation) interleavedActivations(st stage) (float64, int) {
	l, x := ev.l, ev.x
	sets := ChunkInFlight(l.PP, ev.m, l.Chunks(), st.index)
	var a float64
	n := 0
	for c, k := range sets {
		a += float64(st.chunks[c]) * x.layer(l.Recompute) * float64(k)
		n += k
	}
	if st.index == l.PP-1 {
		a += x.headActivations(ev.pr.Model.Vocab) * float64(sets[len(sets)-1])
	}
	return a, n
}

// firstLargest is the first pipeline rank holding the most layers when
// layers are split over p·v virtual stages: with v = 1 the first stage
// with an extra layer (p when there is none, which no rank is).
func firstLargest(layers, p, v int) int {
	if v == 1 {
		return p - layers%p
	}
	best, at := -1, 0
	for i := range p {
		n := 0
		for _, k := range chunkLayers(layers, p, v, i) {
			n += k
		}
		if n > best {
			best, at = n, i
		}
	}
	return at
}

// virtualStagesOf is the model chunks per rank to try on g: pinned, or 1
// and, with a pipeline, each v from 2 to maxSearchedChunks that splits
// every stage's layers into v equal chunks, as Megatron-LM requires
// (--num-layers-per-virtual-pipeline-stage divides the layers per stage).
// Layouts whose micro-batches are not a multiple of pp are rejected with
// the reason.
func virtualStagesOf(m Model, g Grid, sp Space) []int {
	if sp.VirtualStages != nil {
		return sp.VirtualStages
	}
	vs := []int{1}
	if g.PP < 2 || m.Layers%g.PP != 0 {
		return vs
	}
	for v := 2; v <= maxSearchedChunks; v++ {
		if m.Layers/g.PP%v == 0 {
			vs = append(vs, v)
		}
	}
	return vs
}

// maxSearchedChunks bounds the free search's virtual stages: each doubles
// the point-to-point messages for a shrinking gain in bubble, and
// Megatron-LM's published runs use at most a few (Narayanan et al. 2021).
const maxSearchedChunks = 8
