package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// engineZeroStages are the ZeRO stages the built-in engine trains with
// (issue 6); the engine has no tensor or pipeline parallelism, so --auto
// pins TP and PP to 1 and DP to the run's ranks.
var engineZeroStages = []int{0, 1, 2, 3}

// Nominal figures for a CPU rank of the built-in engine: its "device" is
// its share of the host. The FLOP/s only scale the predicted step time (the
// engine's float32 GEMM reaches about this per core with AVX2/AVX-512,
// docs/benchmarks.md); memory decides what fits.
const (
	cpuFLOPSPerCore = 50e9
	shmGbitPerS     = 80 // shared-memory rings between ranks of a host, ~10 GB/s
	tcpGbitPerS     = 10 // between hosts: a plain 10 GbE network is assumed
)

// autoLayout is `gtrain run --auto`: it lays out the job for the run's
// ranks with the planner and prints the choice on stderr. Without --auto it
// returns spec unchanged.
func (o *RunOptions) autoLayout(ctx context.Context, spec train.Spec) (train.Spec, error) {
	if !o.Auto {
		return spec, nil
	}
	nodes, _, err := o.nodes(ctx)
	if err != nil {
		return spec, err
	}
	mem, _, ok := train.HostCapacity()
	if !ok {
		return spec, errors.New("run --auto: host memory: neither MemTotal in /proc/meminfo nor a cgroup memory limit could be read")
	}
	spec, choice, err := autoSpec(spec, cpuTopology(nodes, int64(mem), runtime.NumCPU()))
	if err != nil {
		return spec, err
	}
	b := choice.Candidate
	fmt.Fprintf(o.IO.Err, "gtrain: --auto: dp=%d zero=%d micro_batch=%d grad_accum=%d recompute=%s, the job's global batch of %d sequences (predicted %s of %s per rank, %s per step)\n",
		b.DP, b.ZeroStage, b.MicroBatch, b.GradAccum, b.Recompute, choice.global, planner.GiB(b.Memory.Total), planner.GiB(choice.usable), seconds(b.StepTime))
	return spec, nil
}

// autoChoice is the layout --auto picked, the memory it had per rank and
// the global batch it kept.
type autoChoice struct {
	planner.Candidate
	usable float64
	global int
}

// engineActivations is how engine/model keeps activations: float32, no
// dropout. With it the planner charges each recomputation mode exactly the
// buffers the engine allocates (engine/model's TestActivationsMatchPlanner).
var engineActivations = planner.ActStorage{ElemBytes: 4, NoDropout: true}

// maxGlobalBatch is the most sequences per step --auto plans for (the
// planner's bound); it keeps the product of the job's counts in an int.
const maxGlobalBatch = 1 << 30

// autoSpec searches the engine's layouts of spec on top and returns spec
// with the fastest: dp = the ranks, the ZeRO stage, micro-batch and
// gradient accumulation (keeping the job's global batch) and recompute.
func autoSpec(spec train.Spec, top planner.Topology) (train.Spec, autoChoice, error) {
	c, err := spec.ModelConfig()
	if err != nil {
		return spec, autoChoice{}, usage.Errorf("job: model: %w", err)
	}
	m := planner.Model{Name: spec.Model.Preset, Arch: planner.ArchGPT, Layers: c.Layers, Hidden: c.Embd, Heads: c.Heads,
		Vocab: c.Vocab, Seq: spec.SeqLen(c)}.Normalized()
	world := top.GPUs()
	global, err := jobGlobalBatch(spec.Batch, spec.Parallel.DP, world)
	if err != nil {
		return spec, autoChoice{}, &usage.Error{Err: err}
	}
	opts := planner.DefaultOptions()
	opts.Activations = engineActivations
	pr := planner.Problem{Model: m, Topology: top, GlobalBatch: global, Precision: jobPrecision(spec), Options: opts}
	res, err := planner.Search(pr, planner.Space{TP: []int{1}, PP: []int{1}, DP: []int{world}, Zero: engineZeroStages})
	if err != nil {
		return spec, autoChoice{}, usage.Errorf("run --auto: %w", err)
	}
	best, ok := res.Best()
	if !ok {
		return spec, autoChoice{}, &usage.Error{Err: fmt.Errorf(
			"run --auto: no layout of the job fits in %s per rank (%d rank(s)); the closest: %s; use more hosts or a smaller model or batch.seq",
			planner.GiB(pr.Usable()), world, res.Candidates[0].RejectReason)}
	}
	spec.Parallel = train.Parallel{DP: best.DP, TP: 1, PP: 1, ZeroStage: best.ZeroStage}
	spec.Batch.MicroBatch, spec.Batch.GradAccum = best.MicroBatch, best.GradAccum
	spec.Recompute = string(best.Recompute)
	return spec, autoChoice{best, pr.Usable(), global}, nil
}

// jobGlobalBatch is the global batch the job trains with on world ranks
// without --auto: micro_batch × grad_accum × parallel.dp, dp 0 meaning
// every rank (as the engine reads it). --auto keeps it, so it must divide
// over the ranks: it always does with dp 0 or dp = the ranks.
func jobGlobalBatch(b train.BatchSpec, dp, world int) (int, error) {
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

// jobPrecision reads the job's precision (a key the engine gains with
// issue 6) without depending on it: fp32 when absent or unknown.
func jobPrecision(spec train.Spec) planner.Precision {
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

// cpuTopology describes the run's ranks as planner devices: each rank gets
// its host's memory and cores divided by the host's ranks (every host is
// assumed to be like this one). Hosts with unequal rank counts become one
// rank per "node", which charges every rank the network: conservative.
func cpuTopology(nodes []hostfiles.Node, memTotal int64, cpus int) planner.Topology {
	world, per := 0, 0
	equal := true
	for _, n := range nodes {
		k := len(n.SlotIDs)
		world += k
		equal = equal && (per == 0 || k == per)
		per = max(per, k)
	}
	per = max(per, 1)
	dev := planner.GPU{Name: "cpu-rank", MemoryBytes: memTotal / int64(per),
		PeakFLOPS: float64(max(cpus/per, 1)) * cpuFLOPSPerCore}
	dev.PeakFP32FLOPS = dev.PeakFLOPS
	top := planner.Topology{Nodes: len(nodes), GPUsPerNode: per, GPU: dev,
		Intra: planner.Link{Kind: "shm", GbitPerS: shmGbitPerS}, Inter: planner.Link{Kind: "eth", GbitPerS: tcpGbitPerS}}
	if !equal {
		top.Nodes, top.GPUsPerNode = world, 1
	}
	return top
}
