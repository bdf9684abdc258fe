package main

import (
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/planner"
)

// explain writes where c's memory, time and traffic come from, and the rank
// grid the engine will use (planner.Grid.Coord).
func explain(b *strings.Builder, pr planner.Problem, c planner.Candidate) {
	d, mem := c.Detail, c.Memory
	gib := planner.GiB
	fmt.Fprintf(b, "\nmemory per GPU, most loaded rank (pipeline stage %d of %d: %d layers, %d micro-batch(es) in flight%s):\n",
		d.Stage, c.PP, d.StageLayers, d.InFlight, inFlightNote(c.Layout))
	fmt.Fprintf(b, "  params       %10s   %s weights\n", gib(mem.Params), pr.Precision)
	fmt.Fprintf(b, "  grads        %10s\n", gib(mem.Grads))
	fmt.Fprintf(b, "  optimizer    %10s   fp32 master weights and Adam moments%s\n", gib(mem.Optimizer), zeroNote(c))
	if c.Chunks() > 1 {
		fmt.Fprintf(b, "  activations  %10s   %s per layer per micro-batch (%s) × each chunk's layers × its micro-batches in flight, + %s recompute working set\n",
			gib(mem.Activations), mib(d.LayerActivations), c.Recompute, mib(d.WorkingSet))
	} else {
		fmt.Fprintf(b, "  activations  %10s   %s per layer per micro-batch (%s) × %d × %d, + %s recompute working set\n",
			gib(mem.Activations), mib(d.LayerActivations), c.Recompute, d.StageLayers, d.InFlight, mib(d.WorkingSet))
	}
	fmt.Fprintf(b, "  buffers      %10s   TP gather, gradient bucket or ZeRO-3 prefetch\n", gib(mem.Buffers))
	fmt.Fprintf(b, "  total        %10s   of %s usable (%.0f%% of %s)\n", gib(mem.Total), gib(pr.Usable()),
		pr.Options.UsableMemory*100, gib(float64(pr.Topology.GPU.MemoryBytes)))
	fmt.Fprintf(b, "\nstep time %s:\n", seconds(c.StepTime))
	fmt.Fprintf(b, "  compute + TP  %10s   %d micro-batches × the slowest stage, matrix multiplies at %.0f%% of peak\n",
		seconds(d.Compute), c.GradAccum, d.GEMMEfficiency*100)
	fmt.Fprintf(b, "    memory-bound %9s   of it: LayerNorm, softmax, dropout, GELU, residual adds\n", seconds(d.MemoryBound))
	if c.Chunks() > 1 {
		fmt.Fprintf(b, "  bubble        %10s   (p−1)/(v·m) = %.3f of the compute, interleaved 1F1B over %d model chunks per rank\n", seconds(d.BubbleTime), c.Bubble, c.Chunks())
	} else {
		fmt.Fprintf(b, "  bubble        %10s   (p−1)/m = %.3f of the compute%s\n", seconds(d.BubbleTime), c.Bubble, scheduleNote(c.Layout))
	}
	fmt.Fprintf(b, "  PP exposed    %10s\n", seconds(d.PPExposed))
	fmt.Fprintf(b, "  DP exposed    %10s   of %s, the rest hidden behind backward\n", seconds(d.DPExposed), seconds(d.DPTime))
	fmt.Fprintf(b, "  optimizer     %10s   memory-bound, after the gradients are reduced\n", seconds(d.Optimizer))
	fmt.Fprintf(b, "  FLOPs         %.3g model, %.3g with recomputation: %.1f TFLOP/s per GPU, MFU %.1f%%\n",
		d.ModelFLOPs, d.HardwareFLOPs, c.TFLOPSPerGPU, c.MFU*100)
	explainComm(b, pr, c)
	explainGrid(b, pr, c)
}

func zeroNote(c planner.Candidate) string {
	if c.ZeroStage == 0 || c.DP == 1 {
		return ""
	}
	return fmt.Sprintf("; ZeRO-%d shards them over dp %d", c.ZeroStage, c.DP)
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// explainComm writes each group's traffic and the link it uses.
func explainComm(b *strings.Builder, pr planner.Problem, c planner.Candidate) {
	d, top := c.Detail, pr.Topology
	link := func(inter bool) string {
		if inter {
			return fmt.Sprintf("%s per node, shared by its %d GPUs (crosses nodes)", top.Inter.Describe(), top.GPUsPerNode)
		}
		return top.Intra.Describe() + " (inside a node)"
	}
	fmt.Fprintf(b, "\ncommunication per GPU per step:\n")
	if c.TP > 1 {
		fmt.Fprintf(b, "  TP  %9s  %s: %s, not overlapped (counted in compute + TP)\n", gb(c.CommBytes.TP), link(false), seconds(d.TPTime))
	}
	if c.PP > 1 {
		fmt.Fprintf(b, "  PP  %9s  %s: %s\n", gb(c.CommBytes.PP), link(d.PPInter), seconds(d.PPTime))
	}
	if c.DP > 1 {
		fmt.Fprintf(b, "  DP  %9s  %s, %d of %d ranks per node: %s\n", gb(c.CommBytes.DP), link(d.DPInter), d.DPPerNode, c.DP, seconds(d.DPTime))
	}
	if c.World() == 1 {
		b.WriteString("  none (one GPU)\n")
	}
}

func gb(b float64) string { return fmt.Sprintf("%.3g GB", b/1e9) }

// explainGrid writes rank → (dp, pp, tp) for the first ranks and the
// groups of rank 0: exactly planner.Grid.Coord, which the engine uses.
func explainGrid(b *strings.Builder, pr planner.Problem, c planner.Candidate) {
	g, gpn := c.Grid, pr.Topology.GPUsPerNode
	fmt.Fprintf(b, "\nrank grid (rank → dp, pp, tp; TP fastest; ranks fill nodes of %d in order):\n", gpn)
	n := min(g.World(), 16)
	for r := range n {
		co := g.Coord(r)
		fmt.Fprintf(b, "  rank %-5d node %-4d dp %-4d pp %-4d tp %d\n", r, r/gpn, co.DP, co.PP, co.TP)
	}
	if n < g.World() {
		fmt.Fprintf(b, "  … %d ranks in all (-o json --explain lists every one)\n", g.World())
	}
	writeGroups(b, g)
}

// writeGroups writes the TP, PP and DP groups of rank 0 of g.
func writeGroups(b *strings.Builder, g planner.Grid) {
	group := func(step, size int) string {
		var parts []string
		for i := range min(size, 6) {
			parts = append(parts, fmt.Sprint(i*step))
		}
		if size > 6 {
			parts = append(parts, "…", fmt.Sprint((size-1)*step))
		}
		return strings.Join(parts, ", ")
	}
	fmt.Fprintf(b, "  groups of rank 0: TP {%s}, PP {%s}, DP {%s}\n",
		group(1, g.TP), group(g.TP, g.PP), group(g.TP*g.PP, g.DP))
}

// inFlightNote says what the in-flight count counts under the interleaved
// schedule: each chunk's micro-batches, summed.
func inFlightNote(l planner.Layout) string {
	if l.Chunks() > 1 {
		return fmt.Sprintf(", summed over its %d model chunks", l.Chunks())
	}
	return ""
}
