package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// PlanOptions are the inputs of `gtrain plan`.
type PlanOptions struct {
	IO *IOStreams

	// Request is the model, the cluster (--gpus, --topology or
	// --hostfile), the pinned knobs and the cost model's options.
	Request planner.Request

	Top     int
	All     bool
	Explain bool
	Output  string

	// Detect plans for the hostfile's hosts as they report themselves
	// (plan_detect.go), reached with SSH.
	Detect bool
	SSH    launch.SSHConfig
}

// NewCmdPlan wires the flags of `gtrain plan` into PlanOptions.
func NewCmdPlan(ios *IOStreams) *cobra.Command {
	o := &PlanOptions{IO: ios, Request: planner.Request{}}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Preview 3D-parallel layouts for a model on a cluster",
		Long: `Search tensor × pipeline × data parallel layouts, ZeRO stages, micro-batch
sizes and activation recomputation for a model on a cluster, and rank the
layouts that fit in memory by predicted step time. Memory per GPU, step
time, TFLOP/s, MFU and the pipeline bubble come from published formulas
(ZeRO, Korthikanti et al. 2022, Narayanan et al. 2021; docs/planner.md).

Pin any knob with --tp, --pp, --dp, --zero, --micro-batch, --recompute or
--virtual-stages (model chunks per pipeline rank: 1 is the 1F1B schedule,
more Megatron-LM's interleaved one); with all of them pinned, exactly that
layout is evaluated. --explain breaks
the chosen layout down (memory, communication per link, the rank grid).
Exits 1 when no layout fits, after showing the closest misses and why.`,
		Example: `  gtrain plan --model megatron-1t --gpus 3072 --gpu A100-80GB
  gtrain plan --model llama3-70b --gpus 64 --gpu H100 --inter ib:8x400 --explain
  gtrain plan --params 13B --seq 4096 --global-batch 1024 --gpus 32 --tp 4 --zero 1
  gtrain plan --layers 48 --hidden 6144 --heads 48 --vocab 51200 --seq 2048 --topology cluster.json -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Request.Changed = cmd.Flags().Changed
			return planRun(cmd.Context(), o)
		},
	}
	addPlanFlags(cmd.Flags(), o)
	return cmd
}

func addPlanFlags(f *pflag.FlagSet, o *PlanOptions) {
	r := &o.Request
	f.StringVar(&r.Preset, "model", "", "model preset: "+strings.Join(planner.PresetNames(), ", "))
	f.StringVar(&r.Params, "params", "", "model by parameter count (GPT-3-style shape), e.g. 13B, 1.5e9, 1T")
	f.StringVar((*string)(&r.Shape.Arch), "arch", "", "gpt (GELU MLP, tied embedding) or llama (SwiGLU, GQA, untied); default gpt")
	f.IntVar(&r.Shape.Layers, "layers", 0, "transformer layers")
	f.IntVar(&r.Shape.Hidden, "hidden", 0, "hidden size")
	f.IntVar(&r.Shape.Heads, "heads", 0, "attention heads")
	f.IntVar(&r.Shape.KVHeads, "kv-heads", 0, "key/value heads (grouped-query attention; default: heads)")
	f.IntVar(&r.Shape.FFN, "ffn", 0, "MLP inner size (default 4×hidden; llama: 8/3×hidden rounded up to 256)")
	f.IntVar(&r.Shape.Vocab, "vocab", 0, "vocabulary size")
	f.IntVar(&r.Shape.Seq, "seq", 0, "training sequence length")
	f.IntVar(&r.GlobalBatch, "global-batch", 0, "sequences per optimizer step (default: the preset's published batch, else 512)")
	f.StringVar(&r.Precision, "precision", "bf16", "bf16, fp16 (both mixed with fp32 Adam) or fp32")
	f.IntVar(&r.GPUs, "gpus", 0, "GPUs in the cluster")
	f.IntVar(&r.GPUsPerNode, "gpus-per-node", 8, "GPUs per node (with --gpus)")
	f.StringVar(&r.GPU, "gpu", "A100-80GB", "GPU model: "+strings.Join(planner.GPUNames(), ", "))
	f.StringVar(&r.Intra, "intra", "", "link between GPUs of a node, kind:[Nx]Gb/s or kind:GB/s-with-GB, e.g. nvswitch:300GB, pcie4:256 (default: the GPU's usual)")
	f.StringVar(&r.Inter, "inter", "", "each node's network, kind:NxGb/s, e.g. ib:4x200, eth:100, roce:8x400 (default: the GPU's usual)")
	f.StringVar(&r.Topology, "topology", "", "JSON file describing the cluster (a planner.Topology) instead of --gpus")
	f.StringVarP(&r.Hostfile, "hostfile", "H", "", "hostfile whose slots are GPUs, instead of --gpus")
	f.IntSliceVar(&r.Pins.TP, "tp", nil, "pin the tensor-parallel degree")
	f.IntSliceVar(&r.Pins.PP, "pp", nil, "pin the pipeline-parallel degree")
	f.IntSliceVar(&r.Pins.DP, "dp", nil, "pin the data-parallel degree")
	f.IntSliceVar(&r.Pins.Zero, "zero", nil, "pin the ZeRO stage (0-3)")
	f.IntSliceVar(&r.Pins.MicroBatch, "micro-batch", nil, "pin the micro-batch size (sequences)")
	f.IntSliceVar(&r.Pins.VirtualStages, "virtual-stages", nil, "pin the model chunks per pipeline rank (1: 1F1B; more: the interleaved schedule, Megatron-LM's --virtual-pipeline-model-parallel-size)")
	f.StringSliceVar(&r.Recompute, "recompute", nil, "pin recomputation: none, selective or full")
	f.Float64Var(&r.Options.Efficiency, "efficiency", planner.DefaultOptions().Efficiency, "fraction of peak FLOP/s large matrix multiplies reach (calibrate: docs/planner.md)")
	f.Float64Var(&r.Options.CommEfficiency, "comm-efficiency", planner.DefaultOptions().CommEfficiency, "fraction of a link's rate collectives reach")
	f.Float64Var(&r.Options.UsableMemory, "usable-memory", planner.DefaultOptions().UsableMemory, "fraction of GPU memory tensors may use (the rest: CUDA context, fragmentation)")
	f.BoolVar(&r.Options.SequenceParallel, "sequence-parallel", true, "shard TP-replicated activations over the TP group (Megatron-LM --sequence-parallel)")
	f.IntVar(&o.Top, "top", 10, "show the K fastest layouts")
	f.BoolVar(&o.All, "all", false, "list every evaluated layout, the rejected ones with their reason")
	f.BoolVar(&o.Explain, "explain", false, "explain the chosen layout: memory breakdown, communication per link, rank grid")
	addOutputFlag(f, &o.Output, "one document with every layout")
	addDetectFlags(f, o)
}

// planRun plans and prints.
func planRun(ctx context.Context, o *PlanOptions) error {
	if o.Top < 1 {
		return usage.Errorf("plan: --top %d: must be at least 1 (--all lists everything)", o.Top)
	}
	if err := o.detect(ctx); err != nil {
		return err
	}
	pr, res, err := planner.Plan(ctx, o.Request)
	if err != nil {
		return err
	}
	if o.Output == "json" {
		err = printPlanJSON(o, pr, res)
	} else {
		err = printPlanText(o, pr, res)
	}
	if err != nil {
		return err
	}
	if res.Feasible == 0 {
		return noFitError(pr, res)
	}
	return nil
}
