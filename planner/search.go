package planner

import (
	"cmp"
	"fmt"
	"slices"
)

// Space restricts the search. A nil slice leaves that knob free; a pinned
// knob is evaluated exactly as given, even where the free search would not
// go (so that a pinned layout that cannot run comes back with its reason).
type Space struct {
	TP, PP, DP, Zero, MicroBatch []int
	Recompute                    []Recompute
	VirtualStages                []int // model chunks per pipeline rank (interleave.go); free: virtualStagesOf
}

// Result is a search's outcome.
type Result struct {
	// Candidates are the feasible layouts fastest first (ties: less
	// traffic, lower ZeRO stage, less memory), then the rejected ones, least memory
	// first.
	Candidates []Candidate
	Feasible   int // how many candidates are feasible
	// Pruned counts layouts skipped unevaluated: larger micro-batches of a
	// layout already over memory (memory never falls as the micro-batch
	// grows: in-flight activations are min(p, m)·b micro-batch-sized).
	Pruned int
}

// Best is the fastest feasible candidate.
func (r Result) Best() (Candidate, bool) {
	if r.Feasible == 0 {
		return Candidate{}, false
	}
	return r.Candidates[0], true
}

// Search enumerates TP × PP × DP = GPUs (TP dividing the GPUs per node and
// the heads, PP at most the layers, uneven layer splits allowed), ZeRO 0–3
// (ZeRO 2/3 only with TP = PP = 1, 1–3 only with DP), micro-batches dividing the
// global batch per DP rank, and the recomputation modes; evaluates each in
// closed form and ranks them.
func Search(pr Problem, sp Space) (Result, error) {
	if err := pr.Validate(); err != nil {
		return Result{}, err
	}
	grids := gridsOf(pr, sp)
	if len(grids) == 0 {
		return Result{}, fmt.Errorf("no tp×pp×dp = %d GPUs with the pinned degrees (tp %v, pp %v, dp %v)",
			pr.Topology.GPUs(), sp.TP, sp.PP, sp.DP)
	}
	var r Result
	r.Candidates = make([]Candidate, 0, 1024)
	rcs := sp.Recompute
	if rcs == nil {
		rcs = Recomputes
	}
	for _, g := range grids {
		mbs := microBatchesOf(pr, sp, g)
		for _, z := range zerosOf(g, sp) {
			for _, rc := range rcs {
				for _, v := range virtualStagesOf(pr.Model, g, sp) {
					r.searchMicroBatches(pr, mbs, sp.MicroBatch == nil, Layout{Grid: g, ZeroStage: z, Recompute: rc, VirtualStages: v})
				}
			}
		}
	}
	slices.SortFunc(r.Candidates, compareCandidates)
	return r, nil
}

// microBatchesOf is the micro-batch sizes to try on g: pinned, or the
// divisors of the global batch per DP rank (just 1, to be rejected with the
// reason, when DP does not divide the global batch).
func microBatchesOf(pr Problem, sp Space, g Grid) []int {
	if sp.MicroBatch != nil {
		return sp.MicroBatch
	}
	if pr.GlobalBatch%g.DP != 0 {
		return []int{1}
	}
	return divisors(pr.GlobalBatch / g.DP)
}

// searchMicroBatches evaluates l with each micro-batch size, ascending;
// when the size is free it stops at the first that is over memory.
func (r *Result) searchMicroBatches(pr Problem, mbs []int, free bool, l Layout) {
	for i, b := range mbs {
		l.MicroBatch = b
		c := Evaluate(pr, l)
		r.Candidates = append(r.Candidates, c)
		if c.Feasible {
			r.Feasible++
		} else if free && c.Memory.Total > pr.Usable() {
			r.Pruned += len(mbs) - i - 1
			return
		}
	}
}

// gridsOf lists the grids to evaluate: the pinned degrees, and for each free
// one the values that can run.
func gridsOf(pr Problem, sp Space) []Grid {
	n, gpn := pr.Topology.GPUs(), pr.Topology.GPUsPerNode
	m := pr.Model
	tps := sp.TP
	if tps == nil {
		for _, t := range divisors(gpn) {
			if m.Heads%t == 0 && m.KVHeads%t == 0 && n%t == 0 {
				tps = append(tps, t)
			}
		}
	}
	var grids []Grid
	for _, t := range tps {
		if t < 1 {
			continue
		}
		pps := sp.PP
		if pps == nil {
			for _, p := range divisors(n / t) {
				if p <= m.Layers && n%(t*p) == 0 {
					pps = append(pps, p)
				}
			}
		}
		for _, p := range pps {
			if p < 1 {
				continue
			}
			dps := sp.DP
			if dps == nil {
				if n%(t*p) != 0 {
					continue
				}
				dps = []int{n / (t * p)}
			}
			for _, d := range dps {
				if d >= 1 && (t*p*d == n || sp.TP != nil && sp.PP != nil && sp.DP != nil) {
					grids = append(grids, Grid{TP: t, PP: p, DP: d})
				}
			}
		}
	}
	return grids
}

// zerosOf is the ZeRO stages to try on g: pinned, or 0 without DP, 0–1
// with TP or PP, 0–3 otherwise. ZeRO 2/3 are refused with TP or PP (see
// structuralReason): Megatron-LM's distributed optimizer is ZeRO-1,
// DeepSpeed refuses 2/3 with pipeline parallelism, and the engine's 2/3
// partition the data-parallel model.
func zerosOf(g Grid, sp Space) []int {
	switch {
	case sp.Zero != nil:
		return sp.Zero
	case g.DP == 1:
		return []int{0}
	case g.TP*g.PP > 1:
		return []int{0, 1}
	}
	return []int{0, 1, 2, 3}
}

// divisors lists the divisors of n ascending (none for n < 1).
func divisors(n int) []int {
	var small, large []int
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			small = append(small, d)
			if d != n/d {
				large = append(large, n/d)
			}
		}
	}
	slices.Reverse(large)
	return append(small, large...)
}

// compareCandidates orders feasible before rejected; feasible by step time,
// then traffic, then the lower ZeRO stage, then memory, then fewer model-parallel ranks and lower ZeRO stage (the
// simpler of two equal layouts); rejected by memory.
func compareCandidates(a, b Candidate) int {
	if a.Feasible != b.Feasible {
		if a.Feasible {
			return -1
		}
		return 1
	}
	if a.Feasible {
		// Equal times (traffic hidden behind compute): less traffic is the
		// safer bet.
		if c := cmp.Or(cmp.Compare(a.StepTime, b.StepTime), cmp.Compare(a.CommBytes.DP+a.CommBytes.TP+a.CommBytes.PP,
			b.CommBytes.DP+b.CommBytes.TP+b.CommBytes.PP), cmp.Compare(a.ZeroStage, b.ZeroStage)); c != 0 {
			return c
		}
	}
	return cmp.Or(
		cmp.Compare(a.Memory.Total, b.Memory.Total),
		cmp.Compare(a.TP*a.PP, b.TP*b.PP),
		cmp.Compare(a.ZeroStage, b.ZeroStage),
		cmp.Compare(a.MicroBatch, b.MicroBatch),
		cmp.Compare(a.Recompute, b.Recompute),
		cmp.Compare(a.TP, b.TP),
	)
}
