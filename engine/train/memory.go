package train

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/zero"
	"github.com/gtrain/gtrain/planner"
)

// MemoryEstimate is the memory one rank of a job needs, by category, in
// bytes, worked out before anything is allocated. Figures are float64:
// for shapes near the spec's bounds they exceed an int64, and such a job
// must still be refused with its number rather than overflow.
type MemoryEstimate struct {
	Params, Grads, Optimizer float64 // as the status records report them (engine/zero)
	Activations              float64 // kept for backward, recomputed, and backward's scratch
	Buffers                  float64 // buckets, gathered layers, conversion scratch (an upper estimate)
	// Init is the fp32 copy of every parameter that initialisation fills
	// before the engine takes its part; it is garbage once training
	// starts, but the peak holds it.
	Init float64
	// Data is the synthetic corpus; token files are mapped, not counted.
	Data float64
	// Snapshot is the host copy of what the rank saves, held with
	// checkpoint.async (snapshotEstimate).
	Snapshot float64
}

// Total is the sum of every category.
func (m MemoryEstimate) Total() float64 {
	return m.Params + m.Grads + m.Optimizer + m.Activations + m.Buffers + m.Init + m.Data + m.Snapshot
}

// EstimateMemory is what rank of world ranks, local of them on its host
// (sharing its cores, which sizes the attention scratch), needs to train
// spec, which must be resolved and fitted to world (New does both). A
// micro-batch the model cannot build (model.ActivationUseOf) is an error.
func EstimateMemory(spec Spec, world, rank, local int) (MemoryEstimate, error) {
	zc, err := spec.ZeroConfig()
	if err != nil {
		return MemoryEstimate{}, err
	}
	cfg := spec.Model.Config
	rc, err := model.ParseRecompute(spec.Recompute)
	if err != nil {
		return MemoryEstimate{}, err
	}
	// The activations as the model allocates them (one definition, in
	// engine/model), with the scratch of the backend build gives it.
	T, be := spec.Batch.Seq, backend.CPU{Threads: spec.threads(Env{LocalWorld: local})}
	act, err := model.ActivationUseOf(cfg, spec.Batch.MicroBatch, T, rc, be.AttentionScratch(T))
	if err != nil {
		return MemoryEstimate{}, err
	}
	z := zero.Estimate(zc, cfg, world, rank)
	m := MemoryEstimate{
		Params: float64(z.Params), Grads: float64(z.Grads), Optimizer: float64(z.Optimizer), Buffers: float64(z.Buffers),
		Activations: float64(act.Total()),
		Init:        4 * float64(cfg.NumParams()),
	}
	if mp := spec.Parallel.ModelParallel(); mp > 1 {
		grid := planner.Grid{TP: spec.Parallel.TP, PP: spec.Parallel.PP, DP: max(spec.Parallel.DP, 1)}
		m = gridEstimate(m, spec, zc, rank)
		if m.Activations, err = gridActivations(spec, grid.Coord(rank), be.AttentionScratch(T)); err != nil {
			return MemoryEstimate{}, err
		}
	}
	m.Snapshot = snapshotEstimate(spec, zc, world, rank)
	if spec.Data.Train == "" { // uint16 tokens: the training corpus and a tenth for validation
		m.Data = 2 * float64(spec.Data.Synthetic+max(spec.Data.Synthetic/10, spec.Batch.Seq+2))
	}
	return m, nil
}

// gridEstimate is the model states of a rank under tensor and pipeline
// parallelism: its DP group's ZeRO partition of one replica's 1/(tp·pp)
// (the tied embedding's second copy and the TP-replicated tensors make a
// stage's share a little larger: a small underestimate), no buffers (the
// distributed optimizer reduces in place). gridActivations is the rest.
func gridEstimate(m MemoryEstimate, spec Spec, zc zero.Config, rank int) MemoryEstimate {
	p := spec.Parallel
	grid := planner.Grid{TP: p.TP, PP: p.PP, DP: max(p.DP, 1)}
	z := zero.Estimate(zc, spec.Model.Config, grid.DP, grid.Coord(rank).DP)
	share := float64(p.ModelParallel())
	m.Params, m.Grads, m.Optimizer, m.Buffers = float64(z.Params)/share, float64(z.Grads)/share, float64(z.Optimizer)/share, 0
	return m
}

// gridActivations is what the model.Stage of the rank at c allocates for
// activations (model.StageActivationUseOf, the count of the code that
// allocates them): its sets for the micro-batches the schedule keeps in
// flight there (per chunk when interleaved: gridChunkInFlight), the
// working set and scratch.
func gridActivations(spec Spec, c planner.Coord, attScratch int) (float64, error) {
	p := spec.Parallel
	split, err := spec.ppSplit()
	if err != nil {
		return 0, fmt.Errorf("train: %w", err)
	}
	u, err := model.StageActivationUseOf(model.StageShape{Config: spec.Model.Config, B: spec.Batch.MicroBatch, T: spec.Batch.Seq,
		TP: p.TP, TPRank: c.TP, SequenceParallel: p.SP(), Split: split, Stage: c.PP,
		Recompute: model.Recompute(spec.Recompute), InFlight: gridInFlight(spec, c.PP),
		Chunks: p.chunks(), ChunkInFlight: gridChunkInFlight(spec, c.PP)}, attScratch)
	if err != nil {
		return 0, fmt.Errorf("train: %w", err)
	}
	return float64(u.Total()), nil
}

// gridInFlight is the most micro-batches whose activations stage keeps at
// once, which its Stage allocates sets for and keeps: 1F1B's min(pp −
// stage, m) over the schedules the trainer runs, training's m = grad_accum
// and evaluation's of up to evalChunk validation batches.
func gridInFlight(spec Spec, stage int) int {
	m := spec.Batch.GradAccum
	if spec.Eval.Every > 0 {
		m = max(m, min(evalChunk, spec.Eval.Batches))
	}
	return min(spec.Parallel.PP-stage, m)
}

// hostEstimate is what fitsHost counts for each of a host's local ranks:
// rank's estimate, but under tensor and pipeline parallelism with the
// activations of the busiest stage, since the host's other ranks hold
// other stages (the first keeps the most micro-batches in flight, the last
// the logits). TP rank 0 holds the largest parts (comm.Block gives the
// first ranks the remainder), so it speaks for each stage.
func hostEstimate(spec Spec, world, rank, local int) (MemoryEstimate, error) {
	m, err := EstimateMemory(spec, world, rank, local)
	if err != nil || spec.Parallel.ModelParallel() == 1 {
		return m, err
	}
	T := spec.Batch.Seq
	scratch := backend.CPU{Threads: spec.threads(Env{LocalWorld: local})}.AttentionScratch(T)
	for stage := range spec.Parallel.PP {
		a, err := gridActivations(spec, planner.Coord{PP: stage}, scratch)
		if err != nil {
			return m, err
		}
		m.Activations = max(m.Activations, a)
	}
	return m, nil
}

// HostCapacity is the most memory the ranks of a job on this host can hold
// together, as the memory check counts it: MemTotal, or this process's
// cgroup limit when lower; from says which, and ok is false when neither
// could be read. `run --auto` plans with it, so that the layout it picks
// passes the check.
func HostCapacity() (bytes float64, from string, ok bool) {
	c, _, _ := hostMemory()
	return c.bytes, c.from, c.known()
}

// memLimit is an amount of memory, in bytes, and where it was read.
type memLimit struct {
	bytes float64
	from  string
}

func (l memLimit) known() bool { return l.from != "" }

// MemoryError is a job that does not fit in the memory of a host: found
// before anything is allocated, a usage error.
type MemoryError struct {
	Need  MemoryEstimate // per rank
	Ranks int            // ranks of the job on the host
	// Limit is the memory the ranks cannot exceed (bytes) and From where
	// it was read; with PerProcess it bounds each rank alone (ulimit -v).
	Limit      float64
	From       string
	PerProcess bool
	Now        float64 // bytes available at the moment (0: unknown)
	Other      bool    // another rank's host refused (this one fits)
}

func (e *MemoryError) Error() string {
	if e.Other {
		return "train: the job does not fit in the memory of another rank's host (see that rank's error)"
	}
	n := e.Need
	states := n.Params + n.Grads + n.Optimizer + n.Init
	per := fmt.Sprintf("activations %s, parameters, gradients and optimizer %s", humanBytes(n.Activations), humanBytes(states))
	if n.Buffers > 0 {
		per += ", buffers " + humanBytes(n.Buffers)
	}
	if n.Data > 0 {
		per += ", synthetic data " + humanBytes(n.Data)
	}
	if n.Snapshot > 0 {
		per += ", checkpoint snapshot " + humanBytes(n.Snapshot)
	}
	ranks, has := "", fmt.Sprintf("each process may map at most %s (%s)", humanBytes(e.Limit), e.From)
	if !e.PerProcess {
		if e.Ranks > 1 {
			ranks = fmt.Sprintf(" × %d ranks on this host", e.Ranks)
		}
		has = fmt.Sprintf("this host has %s of memory (%s", humanBytes(e.Limit), e.From)
		if e.Now > 0 {
			has += fmt.Sprintf("; %s available now", humanBytes(e.Now))
		}
		has += ")"
	}
	return fmt.Sprintf("train: the job needs about %s of memory per rank (%s)%s, but %s: %s",
		humanBytes(n.Total()), per, ranks, has, e.hint())
}

// hint says what shrinks the largest part of the estimate.
func (e *MemoryError) hint() string {
	n := e.Need
	states := n.Params + n.Grads + n.Optimizer + n.Init + n.Buffers
	switch {
	case n.Data > states && n.Data > n.Activations:
		return "lower data.synthetic, or train on a token file (data.train)"
	case n.Activations >= states:
		return "lower batch.micro_batch (raising batch.grad_accum keeps the global batch) or batch.seq, or set recompute to selective or full"
	}
	return "use a smaller model, precision bf16, or more ranks with a higher parallel.zero_stage"
}

// CheckMemory refuses, with a *MemoryError, a job whose world ranks, all on
// this host, need more memory than the host has: for the launcher to call
// before it starts any rank. Each rank checks again in New (hosts of a
// multi-host job, and resumes on another rank count). A spec that cannot
// run at world ranks at all passes: the ranks report why.
func CheckMemory(spec Spec, world int) error {
	spec, err := spec.Resolved()
	if err != nil {
		return nil
	}
	world = max(world, 1)
	if spec, err = fitDP(spec, Env{World: world, Resume: true}); err != nil {
		return nil
	}
	_, err = fitsHost(spec, world, 0, world)
	var me *MemoryError
	if !errors.As(err, &me) {
		return nil // a micro-batch the model cannot build: the ranks say so
	}
	return err
}

// fitsHost compares the estimate of local ranks (each as rank's) with the
// host's memory. It refuses a job beyond what the host (or its cgroup, or
// one process) can ever hold, and only warns about one beyond what is
// available at the moment: that changes from second to second on a shared
// host, and refusing on it would make a job's start a matter of luck.
func fitsHost(spec Spec, world, rank, local int) (warning string, err error) {
	local = max(local, 1)
	need, err := hostEstimate(spec, world, rank, local)
	if err != nil {
		return "", err // the same error as building it would give, before anything is allocated
	}
	all := need.Total() * float64(local)
	capacity, now, process := hostMemory()
	e := &MemoryError{Need: need, Ranks: local, Now: now.bytes}
	switch {
	case capacity.known() && all > capacity.bytes:
		e.Limit, e.From = capacity.bytes, capacity.from
		return "", e
	case process.known() && need.Total() > process.bytes:
		e.Limit, e.From, e.PerProcess = process.bytes, process.from, true
		return "", e
	case now.known() && all > now.bytes:
		return fmt.Sprintf("train: the job needs about %s of memory on this host, but only %s is available now (%s): it may run out of memory",
			humanBytes(all), humanBytes(now.bytes), now.from), nil
	}
	return "", nil
}

// checkMemory is a rank's memory check in New. Every rank takes part, so
// that they all stop when one host is too small instead of the others
// waiting for it in their first collective.
func (t *Trainer) checkMemory(ctx context.Context) error {
	warning, err := fitsHost(t.spec, t.env.World, t.env.Rank, t.env.LocalWorld)
	if warning != "" && t.env.Rank == 0 {
		t.env.Warn(warning)
	}
	if t.env.Comm == nil {
		return err
	}
	flag := []float32{0}
	if err != nil {
		flag[0] = 1
	}
	if cerr := t.env.Comm.AllReduce(ctx, comm.F32(flag), comm.Max); cerr != nil {
		return fmt.Errorf("train: memory check: %w", cerr)
	}
	if err == nil && flag[0] > 0 {
		return &MemoryError{Other: true}
	}
	return err
}

// humanBytes formats n bytes in binary units: "512 B", "1.5 GiB".
func humanBytes(n float64) string {
	const units = "KMGTPEZY"
	if n < 1024 {
		return fmt.Sprintf("%.0f B", n)
	}
	i := -1
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", n), ".0") + " " + string(units[i]) + "iB"
}
