package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// engineZeroStages are the ZeRO stages the built-in engine trains with
// (issue 6); the engine has no tensor or pipeline parallelism, so --auto
// pins TP and PP to 1 and DP to the run's ranks.
var engineZeroStages = []int{0, 1, 2, 3}

// engineActivations is how engine/model keeps activations: float32, no
// dropout. With it the planner charges each recomputation mode exactly the
// buffers the engine allocates (engine/model's TestActivationsMatchPlanner).
var engineActivations = planner.ActStorage{ElemBytes: 4, NoDropout: true}

// maxGlobalBatch is the most sequences per step --auto plans for (the
// planner's bound); it keeps the product of the job's counts in an int.
const maxGlobalBatch = 1 << 30

// AutoChoice is the layout AutoLayout picked, the memory it had per rank
// and the global batch it kept.
type AutoChoice struct {
	planner.Candidate
	Usable      float64 // bytes per rank tensors may fill
	GlobalBatch int     // sequences per step, the job's without --auto
}

// AutoLayout is `gtrain run --auto`: it lays spec out for the ranks of
// nodes (every host assumed to be like this one: its memory as the memory
// check counts it, HostCapacity, and its cores) with the planner, and
// returns spec with the fastest layout that fits.
func AutoLayout(spec Spec, nodes []hostfiles.Node) (Spec, AutoChoice, error) {
	mem, _, ok := HostCapacity()
	if !ok {
		return spec, AutoChoice{}, errors.New("run --auto: host memory: neither MemTotal in /proc/meminfo nor a cgroup memory limit could be read")
	}
	ranks := make([]int, len(nodes))
	for i, n := range nodes {
		ranks[i] = len(n.SlotIDs)
	}
	return autoSpec(spec, planner.CPUTopology(ranks, int64(mem), runtime.NumCPU()))
}

// autoSpec searches the engine's layouts of spec on top and returns spec
// with the fastest: dp = the ranks, the ZeRO stage, micro-batch and
// gradient accumulation (keeping the job's global batch) and recompute.
func autoSpec(spec Spec, top planner.Topology) (Spec, AutoChoice, error) {
	c, err := spec.ModelConfig()
	if err != nil {
		return spec, AutoChoice{}, usage.Errorf("job: model: %w", err)
	}
	m := planner.Model{Name: spec.Model.Preset, Arch: planner.ArchGPT, Layers: c.Layers, Hidden: c.Embd, Heads: c.Heads,
		Vocab: c.Vocab, Seq: spec.SeqLen(c)}.Normalized()
	world := top.GPUs()
	global, err := jobGlobalBatch(spec.Batch, spec.Parallel.DP, world)
	if err != nil {
		return spec, AutoChoice{}, &usage.Error{Err: err}
	}
	opts := planner.DefaultOptions()
	opts.Activations = engineActivations
	pr := planner.Problem{Model: m, Topology: top, GlobalBatch: global, Precision: jobPrecision(spec), Options: opts}
	res, err := planner.Search(pr, planner.Space{TP: []int{1}, PP: []int{1}, DP: []int{world}, Zero: engineZeroStages})
	if err != nil {
		return spec, AutoChoice{}, usage.Errorf("run --auto: %w", err)
	}
	best, ok := res.Best()
	if !ok {
		return spec, AutoChoice{}, &usage.Error{Err: fmt.Errorf(
			"run --auto: no layout of the job fits in %s per rank (%d rank(s)); the closest: %s; use more hosts or a smaller model or batch.seq",
			planner.GiB(pr.Usable()), world, res.Candidates[0].RejectReason)}
	}
	spec.Parallel = Parallel{DP: best.DP, TP: 1, PP: 1, ZeroStage: best.ZeroStage}
	spec.Batch.MicroBatch, spec.Batch.GradAccum = best.MicroBatch, best.GradAccum
	spec.Recompute = string(best.Recompute)
	return spec, AutoChoice{best, pr.Usable(), global}, nil
}

// jobGlobalBatch is the global batch the job trains with on world ranks
// without --auto: micro_batch × grad_accum × parallel.dp, dp 0 meaning
// every rank (as the engine reads it). --auto keeps it, so it must divide
// over the ranks: it always does with dp 0 or dp = the ranks.
func jobGlobalBatch(b BatchSpec, dp, world int) (int, error) {
	if dp == 0 {
		dp = world
	}
	if b.MicroBatch < 1 || b.GradAccum < 1 || dp < 1 || b.MicroBatch > maxGlobalBatch || b.GradAccum > maxGlobalBatch ||
		dp > maxGlobalBatch || b.MicroBatch*b.GradAccum > maxGlobalBatch/dp {
		return 0, fmt.Errorf("run --auto: the job's global batch batch.micro_batch %d × batch.grad_accum %d × parallel.dp %d: want 1 to %d sequences",
			b.MicroBatch, b.GradAccum, dp, maxGlobalBatch)
	}
	global := b.MicroBatch * b.GradAccum * dp
	if global%world != 0 {
		return 0, fmt.Errorf("run --auto: the job's global batch of %d sequences (batch.micro_batch %d × batch.grad_accum %d × parallel.dp %d) does not divide over the %d ranks: set parallel.dp to 0 (every rank) or make it a multiple of %d",
			global, b.MicroBatch, b.GradAccum, dp, world, world)
	}
	return global, nil
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
