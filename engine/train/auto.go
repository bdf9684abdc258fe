package train

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// engineActivations is how engine/model keeps activations: float32, no
// dropout. With it the planner charges each recomputation mode exactly the
// buffers the engine allocates (engine/model's TestActivationsMatchPlanner).
var engineActivations = planner.ActStorage{ElemBytes: 4, NoDropout: true}

// maxGlobalBatch is the most sequences per step --auto plans for (the
// planner's bound); it keeps the product of the job's counts in an int.
const maxGlobalBatch = 1 << 30

// AutoChoice is the layout AutoLayout picked (its predicted memory is its
// most loaded rank's), the memory it had per rank and the global batch it
// kept.
type AutoChoice struct {
	planner.Candidate
	Usable      float64 // bytes per rank tensors may fill
	GlobalBatch int     // sequences per step, the job's without --auto
	Split       []int   // layers per pipeline stage (per virtual stage when interleaved), as the planner and the engine split them
}

// AutoLayout is `gtrain run --auto`: it lays spec out for the ranks of
// nodes (every host assumed to be like this one: its memory as the memory
// check counts it, HostCapacity, its cores, and its speed at the engine's
// kernels, MeasureCPU) with the planner, and returns spec with the fastest
// layout that fits.
func AutoLayout(spec Spec, nodes []hostfiles.Node) (Spec, AutoChoice, error) {
	mem, _, ok := HostCapacity()
	if !ok {
		return spec, AutoChoice{}, errors.New("run --auto: host memory: neither MemTotal in /proc/meminfo nor a cgroup memory limit could be read")
	}
	ranks := make([]int, len(nodes))
	for i, n := range nodes {
		ranks[i] = len(n.SlotIDs)
	}
	return autoSpec(spec, MeasureCPU().Topology(ranks, int64(mem), runtime.NumCPU()))
}

// autoSpec searches every layout of spec on top that the engine runs and
// returns spec with the fastest: parallel.tp, pp, dp and zero_stage,
// micro-batch and gradient accumulation (keeping the job's global batch)
// and recompute.
func autoSpec(spec Spec, top planner.Topology) (Spec, AutoChoice, error) {
	return autoSpecWhere(spec, top, nil)
}

// autoSpecWhere is autoSpec among the layouts keep accepts (nil: all).
func autoSpecWhere(spec Spec, top planner.Topology, keep func(planner.Candidate) bool) (Spec, AutoChoice, error) {
	pr, err := enginePlan(spec, top)
	if err != nil {
		return spec, AutoChoice{}, err
	}
	res, err := planner.Search(pr, planner.Space{})
	if err != nil {
		return spec, AutoChoice{}, usage.Errorf("run --auto: %w", err)
	}
	if keep != nil {
		res.Candidates = slices.DeleteFunc(res.Candidates[:res.Feasible:res.Feasible], func(c planner.Candidate) bool { return !keep(c) })
		res.Feasible = len(res.Candidates)
	}
	for _, c := range res.Candidates[:res.Feasible] {
		// The planner's reasons are the engine's refusals; the engine's
		// own check has the last word (its bounds on micro_batch and
		// grad_accum, and whatever it does not train yet).
		if s := withLayout(spec, c); s.Validate() == nil {
			return s, AutoChoice{c, pr.Usable(), pr.GlobalBatch, planner.StageLayers(pr.Model.Layers, c.PP*c.Chunks())}, nil
		}
	}
	if res.Feasible > 0 {
		return spec, AutoChoice{}, &usage.Error{Err: fmt.Errorf(
			"run --auto: the engine trains none of the %d layouts that fit in %s per rank (%d rank(s)); the fastest: %w",
			res.Feasible, planner.GiB(pr.Usable()), top.GPUs(), withLayout(spec, res.Candidates[0]).Validate())}
	}
	closest := "none could be evaluated"
	if len(res.Candidates) > 0 {
		closest = res.Candidates[0].RejectReason
	}
	return spec, AutoChoice{}, &usage.Error{Err: fmt.Errorf(
		"run --auto: no layout of the job fits in %s per rank (%d rank(s)); the closest: %s; use more hosts or a smaller model or batch.seq",
		planner.GiB(pr.Usable()), top.GPUs(), closest)}
}

// enginePlan is the planner's problem of spec on top as the engine trains
// it: the model's shape, the job's global batch and precision, and the
// engine's storage of activations, weights and gradients.
func enginePlan(spec Spec, top planner.Topology) (planner.Problem, error) {
	c, err := spec.ModelConfig()
	if err != nil {
		return planner.Problem{}, usage.Errorf("job: model: %w", err)
	}
	m := planner.Model{Name: spec.Model.Preset, Arch: planner.ArchGPT, Layers: c.Layers, Hidden: c.Embd, Heads: c.Heads,
		Vocab: c.Vocab, Seq: spec.SeqLen(c), Positions: c.Seq}.Normalized()
	global, err := jobGlobalBatch(spec.Batch, spec.Parallel, top.GPUs())
	if err != nil {
		return planner.Problem{}, &usage.Error{Err: err}
	}
	opts := planner.DefaultOptions()
	opts.Activations, opts.States = engineActivations, engineStates(spec)
	opts.SequenceParallel = spec.Parallel.SequenceParallel == nil || *spec.Parallel.SequenceParallel
	return planner.Problem{Model: m, Topology: top, GlobalBatch: global, Precision: jobPrecision(spec), Options: opts}, nil
}

// engineStates is how the engine keeps weights and gradients: on the
// data-parallel path (tp = pp = 1) in the precision's type, gradients in
// parallel.grad_dtype; with tp·pp > 1 model.Stage keeps float32 working
// weights (rounded to the precision) and float32 gradients, whatever the
// precision. The optimizer is the planner's: Adam moments, and fp32
// master weights under bf16 and fp16.
func engineStates(spec Spec) planner.StateStorage {
	st := planner.StateStorage{MPWeights: 4, MPGrads: 4}
	if spec.Parallel.GradDType == "fp32" {
		st.Grads = 4
	}
	return st
}

// withLayout is spec laid out as planner candidate c: parallel.tp, pp, dp
// and zero_stage, batch.micro_batch and grad_accum, and recompute; the
// planner's split of the layers (pp_layers cleared) and the candidate's
// schedule (virtual_stages: the one the planner's bubble counts). The rest
// of parallel (sequence parallelism, buckets, gradient type) stays the
// job's.
func withLayout(spec Spec, c planner.Candidate) Spec {
	p := &spec.Parallel
	p.TP, p.PP, p.DP, p.ZeroStage = c.TP, c.PP, c.DP, c.ZeroStage
	p.PPLayers, p.VirtualStages = nil, c.VirtualStages
	spec.Batch.MicroBatch, spec.Batch.GradAccum = c.MicroBatch, c.GradAccum
	spec.Recompute = string(c.Recompute)
	return spec
}

// jobGlobalBatch is the global batch the job trains with on world ranks
// without --auto: micro_batch × grad_accum × parallel.dp, dp 0 meaning
// every rank over the job's tp × pp (as the engine reads it). --auto keeps
// it; the search rejects the layouts whose dp does not divide it.
func jobGlobalBatch(b BatchSpec, p Parallel, world int) (int, error) {
	dp := p.DP
	if dp == 0 {
		if mp := p.ModelParallel(); world%mp == 0 {
			dp = world / mp
		} else {
			return 0, fmt.Errorf("run --auto: the job's parallel.tp %d × parallel.pp %d do not divide the %d ranks, so parallel.dp 0 (every replica) gives no global batch: set parallel.dp, or tp and pp to 1",
				max(p.TP, 1), max(p.PP, 1), world)
		}
	}
	if b.MicroBatch < 1 || b.GradAccum < 1 || dp < 1 || b.MicroBatch > maxGlobalBatch || b.GradAccum > maxGlobalBatch ||
		dp > maxGlobalBatch || b.MicroBatch*b.GradAccum > maxGlobalBatch/dp {
		return 0, fmt.Errorf("run --auto: the job's global batch batch.micro_batch %d × batch.grad_accum %d × parallel.dp %d: want 1 to %d sequences",
			b.MicroBatch, b.GradAccum, dp, maxGlobalBatch)
	}
	return b.MicroBatch * b.GradAccum * dp, nil
}

// jobPrecision reads the job's precision as its JSON spells it: fp32 when
// absent or unknown.
func jobPrecision(spec Spec) planner.Precision {
	b, err := json.Marshal(spec)
	if err != nil {
		return planner.FP32
	}
	return precisionOf(b)
}

// precisionOf is the "precision" key of a job's JSON, fp32 when absent or
// not one the planner knows.
func precisionOf(job []byte) planner.Precision {
	var v struct {
		Precision string `json:"precision"`
	}
	if json.Unmarshal(job, &v) != nil {
		return planner.FP32
	}
	if p, err := planner.ParsePrecision(v.Precision); err == nil {
		return p
	}
	return planner.FP32
}

// GlobalBatch is the sequences per step spec trains on world ranks:
// micro_batch × grad_accum × dp, dp 0 meaning every replica.
func GlobalBatch(spec Spec, world int) (int, error) {
	g, err := jobGlobalBatch(spec.Batch, spec.Parallel, world)
	if err != nil {
		return 0, &usage.Error{Err: err}
	}
	return g, nil
}

// Refit lays spec out for a restart on world ranks that keeps its global
// batch of global sequences per step (an elastic job that lost or gained
// hosts): tp and pp stay, dp is every replica the ranks make, and
// micro_batch × grad_accum = global / dp. It keeps grad_accum where it
// can, as a resume's resharding does: the sampler draws one global
// micro-batch per micro-step, so the same accumulation sees exactly the
// data of the uninterrupted run. Else it takes the accumulation with a
// micro_batch no larger than the job's (its activations were sized for
// it), nearest the job's. The checkpoint loads into any layout
// (engine/zero and the grid reshard it).
func Refit(spec Spec, world, global int) (Spec, error) {
	p := &spec.Parallel
	mp := p.ModelParallel()
	if world < 1 || world%mp != 0 {
		return spec, fmt.Errorf("train: restart on %d ranks: parallel.tp %d × parallel.pp %d = %d ranks per replica do not divide them; give the job tp and pp that do, or --auto to re-plan them",
			world, max(p.TP, 1), max(p.PP, 1), mp)
	}
	dp := world / mp
	if global%dp != 0 {
		return spec, fmt.Errorf("train: restart on %d ranks: %d replicas do not divide the global batch of %d sequences; keep --nnodes to host counts whose replicas divide it",
			world, dp, global)
	}
	per := global / dp // micro_batch × grad_accum of each replica
	p.DP = dp
	b := &spec.Batch
	for _, accum := range accumsFor(per, b.MicroBatch, b.GradAccum) {
		b.MicroBatch, b.GradAccum = per/accum, accum
		if spec.Validate() == nil {
			return spec, nil
		}
	}
	return spec, fmt.Errorf("train: restart on %d ranks (dp %d): no micro_batch × grad_accum of %d sequences per replica is one the engine trains: %w",
		world, dp, per, spec.Validate())
}

// accumsFor is the divisors of per as accumulations: accum itself first,
// then those that leave a micro-batch no larger than micro, each group
// nearest to accum first.
func accumsFor(per, micro, accum int) []int {
	var ds []int
	for d := 1; d*d <= per; d++ {
		if per%d == 0 {
			ds = append(ds, d)
			if d*d != per {
				ds = append(ds, per/d)
			}
		}
	}
	key := func(d int) int {
		switch {
		case d == accum:
			return 0
		case per/d <= micro:
			return 1
		}
		return 2
	}
	dist := func(d int) int { return max(d-accum, accum-d) }
	slices.SortStableFunc(ds, func(a, b int) int {
		return cmp.Or(cmp.Compare(key(a), key(b)), cmp.Compare(dist(a), dist(b)), cmp.Compare(a, b))
	})
	return ds
}

// AutoLayoutOn is AutoLayout on a topology the hosts reported (their
// agents' facts, planner.CPUTopologyOf) rather than one assumed from this
// machine, keeping the job's global batch of global sequences per step: a
// layout decided once the hosts have joined, and again at every elastic
// restart. accum > 0 asks for that gradient accumulation, the fastest
// layout with it if any fits (a restart then sees the data of the
// uninterrupted run: see Refit), else the fastest of all.
func AutoLayoutOn(spec Spec, top planner.Topology, global, accum int) (Spec, AutoChoice, error) {
	// One replica of the whole batch, as the search reads it: it sets
	// every count it keeps anew (withLayout).
	spec.Batch.MicroBatch, spec.Batch.GradAccum = global, 1
	spec.Parallel.TP, spec.Parallel.PP, spec.Parallel.DP = 1, 1, 1
	if accum > 0 {
		s, c, err := autoSpecWhere(spec, top, func(c planner.Candidate) bool { return c.GradAccum == accum })
		if err == nil {
			return s, c, nil
		}
	}
	return autoSpec(spec, top)
}
