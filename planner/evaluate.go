package planner

import (
	"cmp"
	"fmt"
	"math"
)

// Problem is what a search plans for: a model on a cluster with a global
// batch, at a precision, under the cost model's options.
type Problem struct {
	Model       Model
	Topology    Topology
	GlobalBatch int // sequences per optimizer step
	Precision   Precision
	Options     Options
}

// Validate reports the first input the search cannot work with.
func (pr Problem) Validate() error {
	if err := pr.Model.Validate(); err != nil {
		return err
	}
	if err := pr.Topology.Validate(); err != nil {
		return err
	}
	o := pr.Options
	switch {
	case pr.GlobalBatch < 1 || pr.GlobalBatch > 1<<30:
		return fmt.Errorf("global batch %d: must be 1 to %d sequences", pr.GlobalBatch, 1<<30)
	case pr.Precision != BF16 && pr.Precision != FP16 && pr.Precision != FP32:
		return fmt.Errorf("precision %q: want bf16, fp16 or fp32", pr.Precision)
	case pr.Precision == BF16 && pr.Topology.GPU.NoBF16:
		return fmt.Errorf("gpu %s has no bfloat16: use fp16 (with loss scaling) or fp32", pr.Topology.GPU.Name)
	case !(o.Efficiency > 0 && o.Efficiency <= 1):
		return fmt.Errorf("efficiency %g: must be in (0, 1]", o.Efficiency)
	case !(o.CommEfficiency > 0 && o.CommEfficiency <= 1):
		return fmt.Errorf("comm efficiency %g: must be in (0, 1]", o.CommEfficiency)
	case !(o.UsableMemory > 0 && o.UsableMemory <= 1):
		return fmt.Errorf("usable memory %g: must be in (0, 1]", o.UsableMemory)
	}
	if err := o.States.validate(); err != nil {
		return err
	}
	return o.Activations.validate()
}

// Usable is the bytes per GPU tensors may fill.
func (pr Problem) Usable() float64 {
	return float64(pr.Topology.GPU.MemoryBytes) * pr.Options.UsableMemory
}

// Layout is one point of the search: the 3D grid, the ZeRO stage, the
// micro-batch (sequences), the recomputation mode and the model chunks
// per pipeline rank.
type Layout struct {
	Grid
	ZeroStage  int       `json:"zero_stage"`
	MicroBatch int       `json:"micro_batch"`
	Recompute  Recompute `json:"recompute"`
	// VirtualStages is the model chunks per pipeline rank of the
	// interleaved schedule (Megatron-LM's
	// virtual_pipeline_model_parallel_size; see interleave.go): 0 or 1
	// for 1F1B.
	VirtualStages int `json:"virtual_stages,omitempty"`
}

// Candidate is an evaluated Layout. Memory is per GPU on the most loaded
// rank; CommBytes are bytes each GPU sends per step on each kind of group.
type Candidate struct {
	Layout
	GradAccum    int       `json:"grad_accum"`
	Feasible     bool      `json:"feasible"`
	RejectReason string    `json:"reject_reason,omitempty"`
	Memory       Memory    `json:"memory"`
	StepTime     float64   `json:"step_time_s"`
	TFLOPSPerGPU float64   `json:"tflops_per_gpu"` // hardware FLOPs (recomputation included), as Megatron-LM reports
	MFU          float64   `json:"mfu"`            // model FLOPs only
	Bubble       float64   `json:"bubble_fraction"`
	Schedule     string    `json:"schedule,omitempty"` // the pipeline schedule: Layout.Schedule
	CommBytes    CommBytes `json:"comm_bytes"`
	Detail       Detail    `json:"-"`
}

// CommBytes is the traffic per GPU per step of each kind of group.
type CommBytes struct {
	TP float64 `json:"tp"`
	PP float64 `json:"pp"`
	DP float64 `json:"dp"`
}

// Detail is how a candidate's numbers came about, for --explain. Times are
// seconds per step.
type Detail struct {
	Stage            int     `json:"stage"`             // the most loaded pipeline stage
	StageLayers      int     `json:"stage_layers"`      // its layers
	InFlight         int     `json:"in_flight"`         // micro-batches whose activations it holds (chunk sets, summed over chunks, when interleaved)
	LayerActivations float64 `json:"layer_activations"` // bytes per layer per micro-batch
	WorkingSet       float64 `json:"working_set"`       // recomputation's live extra, bytes
	Compute          float64 `json:"compute_s"`         // m × the slowest stage's micro-batch
	BubbleTime       float64 `json:"bubble_s"`          // (p−1)/v × it
	MemoryBound      float64 `json:"memory_bound_s"`    // the part of Compute in memory-bound kernels
	TPTime           float64 `json:"tp_s"`
	PPTime           float64 `json:"pp_s"`
	DPTime           float64 `json:"dp_s"`
	PPExposed        float64 `json:"pp_exposed_s"` // the part not hidden behind compute
	DPExposed        float64 `json:"dp_exposed_s"`
	Optimizer        float64 `json:"optimizer_s"`   // the optimizer step, after the gradients are reduced
	PPInter          bool    `json:"pp_inter_node"` // the group crosses nodes
	DPInter          bool    `json:"dp_inter_node"`
	DPPerNode        int     `json:"dp_per_node"` // members of a DP group on one node
	GEMMEfficiency   float64 `json:"gemm_efficiency"`
	ModelFLOPs       float64 `json:"model_flops"` // per step
	HardwareFLOPs    float64 `json:"hardware_flops"`
}

// stage is one rank's share of a pipeline stage of the model.
type stage struct {
	index, layers int
	chunks        []int   // layers of each model chunk (interleaved only): layers is their sum
	psi           float64 // parameters of the rank (before ZeRO partitions them)
	dpRank        int     // its place in its DP group, which sizes its ZeRO partitions
}

// StageLayers splits layers over stages pipeline stages as evenly as
// possible and returns each stage's layers, the one split the planner
// costs and the engine runs. The extra layers of an uneven split go to the
// last stages, which hold the fewest micro-batches in flight under 1F1B
// (BLOOM and Llama 3 405B split unevenly too). With more stages than
// layers the first stages get none (Evaluate rejects such layouts); stages
// below 1 give nil.
func StageLayers(layers, stages int) []int {
	if stages < 1 {
		return nil
	}
	s := make([]int, stages)
	for i := range s {
		s[i] = stageLayers(layers, stages, i)
	}
	return s
}

// stageLayers is StageLayers(layers, p)[i] without the slice: Evaluate
// needs a few stages of layouts whose p may be large.
func stageLayers(layers, p, i int) int {
	l := layers / p
	if extra := layers % p; i >= p-extra {
		l++
	}
	return l
}

// stageOf is stage i of p, its layers split as StageLayers does, on TP
// rank 0 and DP rank 0 of t: the stage's most loaded rank (see rankStage).
func stageOf(m Model, i, p, t int) stage { return rankStage(m, i, p, t, 0) }

// rankStage is what TP rank r of t holds of stage i of p, as a
// Megatron-LM rank holds it: its layers' share (Model.rankLayerParams);
// on the first stage the vocabulary-parallel token embedding (rows cut as
// comm.Block cuts them, so the first V mod t ranks hold one more) and the
// replicated learned positions; on the last the replicated final norm and
// the output layer: Llama's own, vocabulary-parallel, or for a tied GPT
// with p > 1 Megatron's copy of the embedding.
func rankStage(m Model, i, p, t, r int) stage { return rankChunks(m, i, p, 1, t, r) }

// rankChunks is rankStage for a rank holding v model chunks (interleaved:
// see interleave.go), the layers split over p·v virtual stages; the
// embedding is on virtual stage 0 (rank 0's chunk 0), the head on the last
// (rank p−1's chunk v−1).
func rankChunks(m Model, i, p, v, t, r int) stage {
	l := stageLayers(m.Layers, p, i)
	var chunks []int
	if v > 1 {
		chunks = chunkLayers(m.Layers, p, v, i)
		l = 0
		for _, n := range chunks {
			l += n
		}
	}
	vocab := blockOf(float64(m.Vocab), r, t) * float64(m.Hidden)
	psi := float64(l) * m.rankLayerParams(t)
	if i == 0 {
		psi += vocab + m.positionParams()
	}
	if i == p-1 {
		psi += m.normParams()
		if m.Arch == ArchLlama || p > 1 {
			psi += vocab
		}
	}
	return stage{index: i, layers: l, chunks: chunks, psi: psi}
}

// Evaluate computes memory, time and feasibility of one layout. It never
// panics: a layout that is not even well-formed comes back infeasible with
// the reason.
func Evaluate(pr Problem, l Layout) Candidate {
	c := Candidate{Layout: l, Schedule: l.Schedule()}
	if err := l.Validate(); err != nil {
		c.RejectReason = err.Error()
		return c
	}
	c.GradAccum = max(1, pr.GlobalBatch/(l.DP*l.MicroBatch))
	ev := newEvaluation(pr, l, c.GradAccum)
	ev.memory(&c)
	ev.time(&c)
	c.RejectReason = cmp.Or(structuralReason(pr, l), interleaveReason(pr.Model, l, c.GradAccum))
	if c.RejectReason == "" && c.Memory.Total > pr.Usable() {
		c.RejectReason = fmt.Sprintf("needs %s per GPU, over the %s usable (%.0f%% of %s)",
			GiB(c.Memory.Total), GiB(pr.Usable()), pr.Options.UsableMemory*100, GiB(float64(pr.Topology.GPU.MemoryBytes)))
	}
	c.Feasible = c.RejectReason == ""
	return c
}

// Validate reports a knob out of range.
func (l Layout) Validate() error {
	if err := l.Grid.Validate(); err != nil {
		return err
	}
	// Bounds keep TP×PP×DP and DP×micro-batch far from overflowing an int.
	const big = 1 << 20
	if l.TP > big || l.PP > big || l.DP > big || l.MicroBatch < 1 || l.MicroBatch > big {
		return fmt.Errorf("planner: layout tp=%d pp=%d dp=%d micro_batch=%d: micro_batch must be at least 1 and every knob at most %d",
			l.TP, l.PP, l.DP, l.MicroBatch, big)
	}
	if l.VirtualStages < 0 || l.VirtualStages > MaxVirtualStages {
		return fmt.Errorf("planner: layout virtual_stages=%d: want 0 to %d model chunks per pipeline rank", l.VirtualStages, MaxVirtualStages)
	}
	return nil
}

// structuralReason is why a layout cannot run at all, or "".
func structuralReason(pr Problem, l Layout) string {
	m, top := pr.Model, pr.Topology
	gpn := top.GPUsPerNode
	switch {
	case l.TP > gpn:
		return fmt.Sprintf("tp %d exceeds the %d GPUs of a node: TP all-reduces every layer would cross the network", l.TP, gpn)
	case gpn%l.TP != 0:
		return fmt.Sprintf("tp %d does not divide the %d GPUs of a node: TP groups would straddle nodes", l.TP, gpn)
	case m.Heads%l.TP != 0:
		return fmt.Sprintf("tp %d does not divide the %d attention heads", l.TP, m.Heads)
	case m.KVHeads%l.TP != 0:
		return fmt.Sprintf("tp %d does not divide the %d key/value heads", l.TP, m.KVHeads)
	case l.World() != top.GPUs():
		return fmt.Sprintf("tp×pp×dp = %d, not the %d GPUs", l.World(), top.GPUs())
	case l.PP > m.Layers:
		return fmt.Sprintf("pp %d exceeds the %d layers", l.PP, m.Layers)
	case l.ZeroStage < 0 || l.ZeroStage > 3:
		return fmt.Sprintf("zero stage %d: want 0 to 3", l.ZeroStage)
	case l.ZeroStage >= 2 && l.PP > 1:
		return fmt.Sprintf("zero %d with pp %d: ZeRO-2/3 reduce gradients every micro-batch, which pipeline schedules do not allow (DeepSpeed refuses it); use zero 0 or 1", l.ZeroStage, l.PP)
	case l.ZeroStage >= 2 && l.TP > 1:
		return fmt.Sprintf("zero %d with tp %d: ZeRO-2/3 partition the data-parallel model's gradients and weights, not a tensor-parallel shard (Megatron-LM's distributed optimizer is ZeRO-1); use zero 0 or 1", l.ZeroStage, l.TP)
	case l.TP > m.Vocab:
		return fmt.Sprintf("tp %d exceeds the vocabulary of %d tokens: some ranks would hold no rows of the embedding", l.TP, m.Vocab)
	case pr.Options.SequenceParallel && l.TP > 1 && (m.Seq*l.MicroBatch)%l.TP != 0:
		return fmt.Sprintf("sequence parallelism splits micro_batch × seq = %d × %d tokens over tp %d, which does not divide them; choose another micro-batch or tp", l.MicroBatch, m.Seq, l.TP)
	case pr.GlobalBatch%(l.DP*l.MicroBatch) != 0:
		return fmt.Sprintf("global batch %d is not divisible by dp×micro_batch = %d×%d", pr.GlobalBatch, l.DP, l.MicroBatch)
	case l.Recompute != RecomputeNone && l.Recompute != RecomputeSelective && l.Recompute != RecomputeFull:
		return fmt.Sprintf("recompute %q: want none, selective or full", l.Recompute)
	}
	return ""
}

// evaluation holds what memory and time share for one layout.
type evaluation struct {
	pr     Problem
	l      Layout
	m      int // micro-batches per step (gradient accumulation)
	x      actShape
	stages [3]stage // first, first with an extra layer, last; fewer when they coincide
	n      int
	net    net
}

func newEvaluation(pr Problem, l Layout, m int) evaluation {
	ev := evaluation{pr: pr, l: l, m: m, net: newNet(pr.Topology, pr.Options)}
	ev.x = newActShape(pr.Model, l.MicroBatch, l.TP, pr.Options.SequenceParallel, pr.Precision, pr.Options.Activations)
	// The most loaded stage is the first (most micro-batches in flight, the
	// embedding), the first with an extra layer, or the last (the output
	// layer); the others hold no more than one of these.
	for _, i := range [3]int{0, firstLargest(pr.Model.Layers, l.PP, l.Chunks()), l.PP - 1} {
		if i < l.PP && (ev.n == 0 || ev.stages[ev.n-1].index < i) {
			ev.stages[ev.n] = rankChunks(pr.Model, i, l.PP, l.Chunks(), l.TP, 0)
			ev.n++
		}
	}
	return ev
}

// memory fills c.Memory with the most loaded of the stages.
func (ev *evaluation) memory(c *Candidate) {
	for _, st := range ev.stages[:ev.n] {
		mem, inflight := ev.stageMemory(st)
		if mem.Total > c.Memory.Total {
			c.Memory = mem
			c.Detail.Stage, c.Detail.StageLayers, c.Detail.InFlight = st.index, st.layers, inflight
		}
	}
	c.Detail.LayerActivations = ev.x.layer(ev.l.Recompute)
	c.Detail.WorkingSet = ev.x.workingSet(ev.l.Recompute)
}

func (ev *evaluation) stageMemory(st stage) (Memory, int) {
	l, x := ev.l, ev.x
	var mem Memory
	w, g, k := ev.stateBytes()
	mem.Params, mem.Grads, mem.Optimizer = rankStates(st.psi, st.dpRank, l.DP, l.ZeroStage, w, g, k)
	// 1F1B: stage i holds the activations of min(p−i, m) micro-batches.
	inflight := min(l.PP-st.index, ev.m)
	a := float64(st.layers) * x.layer(l.Recompute) * float64(inflight)
	if st.index == l.PP-1 {
		a += x.headActivations(ev.pr.Model.Vocab)
	}
	if st.chunks != nil {
		a, inflight = ev.interleavedActivations(st)
	}
	mem.Activations = a + x.workingSet(l.Recompute)
	mem.Buffers = ev.buffers(st)
	mem.Total = mem.Params + mem.Grads + mem.Optimizer + mem.Activations + mem.Buffers
	return mem, inflight
}

// stateBytes is the bytes per element of working weights, gradients and
// optimizer state on this layout (see StateStorage).
func (ev *evaluation) stateBytes() (w, g, k float64) {
	return ev.pr.Options.States.bytes(ev.pr.Precision, ev.l.TP*ev.l.PP > 1)
}

// RankMemory is the memory Evaluate charges the rank at c of layout l, by
// category: a Candidate's Memory is RankMemory of its most loaded rank.
// The model states are exact for a framework that holds what a
// Megatron-LM rank holds (rankStage) and partitions them as rankStates
// says, as the built-in engine does with tp·pp > 1.
func RankMemory(pr Problem, l Layout, c Coord) (Memory, error) {
	if err := pr.Validate(); err != nil {
		return Memory{}, err
	}
	if err := l.Validate(); err != nil {
		return Memory{}, err
	}
	if c.TP < 0 || c.TP >= l.TP || c.PP < 0 || c.PP >= l.PP || c.DP < 0 || c.DP >= l.DP {
		return Memory{}, fmt.Errorf("planner: rank (dp %d, pp %d, tp %d): outside the layout tp=%d pp=%d dp=%d", c.DP, c.PP, c.TP, l.TP, l.PP, l.DP)
	}
	ev := newEvaluation(pr, l, max(1, pr.GlobalBatch/(l.DP*l.MicroBatch)))
	st := rankChunks(pr.Model, c.PP, l.PP, l.Chunks(), l.TP, c.TP)
	st.dpRank = c.DP
	mem, _ := ev.stageMemory(st)
	return mem, nil
}

// buffers are communication buffers: the sequence-parallel all-gather of a
// layer's input, a gradient bucket in flight (Megatron-LM's default size,
// max(40M, 1M·dp) elements), or under ZeRO-3 two layers' gathered weights
// (the current one and the prefetched next). A pipeline's receive buffer is
// the stage's input, which the activations already count.
func (ev *evaluation) buffers(st stage) float64 {
	l, x := ev.l, ev.x
	w, g, _ := ev.stateBytes()
	sbh := x.s * x.b * x.h
	var b float64
	if l.TP > 1 {
		b += x.e * sbh
	}
	switch {
	case l.ZeroStage == 3 && l.DP > 1:
		b += math.Min(2*ev.pr.Model.LayerParams()/x.t, st.psi) * w
	case l.DP > 1:
		b += math.Min(st.psi, math.Max(4e7, 1e6*float64(l.DP))) * g
	}
	return b
}

// GiB formats bytes as GiB with one decimal.
func GiB(b float64) string { return fmt.Sprintf("%.1f GiB", b/gib) }
